"""The schedule simulator: the project's real driver loops and GroupStream on a virtual clock.

Modules: ``presets`` (inputs and their sources), ``clock`` (the virtual-time event loop), ``engine``
(the SGLang engine and trainer model), ``actors`` (RolloutManager / train group / data source
stand-ins around the real stream), ``schedules`` (one simulated run), ``bound`` (the throughput
bound), ``report`` (tables, per-length-decile counts), ``frontier`` (the K x push x split sweep),
``planner`` (split and engine size for a model, batch and length distribution), ``calibration``
(the engine model against published decode measurements), ``runtime`` (the embedded runtime's
measurement and validation), ``agentic`` (multi-turn trajectories with tool calls between the engine
calls) and ``agentic_price`` (the agentic preset's frontier and band). ``bench/schedule_sim.py`` is the entry point."""
