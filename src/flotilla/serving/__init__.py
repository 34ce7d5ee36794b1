"""Pure serving logic: latency model, PD planner and re-planning with hysteresis."""
