"""One module per `flotilla` subcommand (see flotilla.cli)."""
