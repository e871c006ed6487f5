"""The planner, pure and shape-only: :mod:`.schedule` (the frozen, printable Plan; what it
moves: :mod:`.traffic`),
:mod:`.model` (rates and the pipeline model that predicts a plan's time), :mod:`.search`
(choosing the plan) and :mod:`.workspace` (the gemm's passes over panels ahead of the product,
and their device memory). The names below are those the rest of bigmm plans with."""

from __future__ import annotations

from .model import READ_RATE, WRITE_RATE, Rates, predict_seconds, simulate, stage_times
from .schedule import C_SLOTS, ORDERS, Plan, Step, Tile
from .search import cpu_step_bytes, even_edge, make_plan
from .workspace import (DIRECT_ROWS, STORED_BYTES, direct_workspace_bytes, reads_as_stored,
                        rounds_one_ahead, split_workspace_bytes, splits_ahead, stored_fits)

__all__ = ["C_SLOTS", "DIRECT_ROWS", "ORDERS", "READ_RATE", "STORED_BYTES", "WRITE_RATE", "Plan",
           "Rates", "Step", "Tile", "cpu_step_bytes", "direct_workspace_bytes", "even_edge",
           "make_plan", "predict_seconds", "reads_as_stored", "rounds_one_ahead", "simulate",
           "split_workspace_bytes", "splits_ahead", "stage_times", "stored_fits"]
