"""The control plane: a FastAPI service that accepts RL jobs over REST, keeps their records in SQL,
runs them through the Ray Jobs API and exports Prometheus metrics.

Importing this package is cheap (no FastAPI, torch or Ray). The REST wire models live in `tgc_rl.wire` (the SDK
and the client distribution share them without this package).
Build the app with `tgc_rl.control.app.create_app(ControlSettings(...))` or run `tgc serve`.
"""
