from services.trainer.main import cli

raise SystemExit(cli())
