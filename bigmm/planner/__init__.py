"""The planner, pure and shape-only: :mod:`.schedule` (the frozen, printable Plan),
:mod:`.model` (rates and the pipeline model that predicts a plan's time) and :mod:`.search`
(choosing the plan). The names below are those the rest of bigmm plans with."""

from __future__ import annotations

from .model import READ_RATE, WRITE_RATE, Rates, predict_seconds, simulate, stage_times
from .schedule import (C_SLOTS, ORDERS, Plan, Step, Tile, direct_workspace_bytes,
                       split_workspace_bytes, splits_ahead)
from .search import cpu_step_bytes, even_edge, make_plan

__all__ = ["C_SLOTS", "ORDERS", "READ_RATE", "WRITE_RATE", "Plan", "Rates", "Step", "Tile",
           "cpu_step_bytes", "even_edge", "make_plan", "predict_seconds", "simulate",
           "direct_workspace_bytes", "split_workspace_bytes", "splits_ahead", "stage_times"]
