from tgc_rl.trainer.main import cli

raise SystemExit(cli())
