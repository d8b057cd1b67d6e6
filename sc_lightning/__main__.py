"""``python -m sc_lightning``: the command-line entry point."""

from sc_lightning.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
