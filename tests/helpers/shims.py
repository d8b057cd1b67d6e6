"""Recording shims: stand-ins for a cluster's commands (``srun``, ``scontrol``, ``ray``, ``python``) on ``PATH``,
so a launch script runs on any machine and says what it would have run."""

from __future__ import annotations

from pathlib import Path

SHIMS = {
    # srun: record its options and the rendezvous it hands its tasks, then run its command (as one task would)
    "srun": 'echo "srun $* | MASTER_ADDR=$MASTER_ADDR MASTER_PORT=$MASTER_PORT RAY_ADDRESS=$RAY_ADDRESS" '
    '>> "$SHIM_LOG"\nwhile [[ $1 == -* ]]; do shift; done\nexec "$@"\n',
    "scontrol": '[[ "$1 $2" == "show hostnames" ]] && printf "%s\\n" $SHIM_NODES\n',
    "ray": 'echo "ray $*" >> "$SHIM_LOG"\n',
    "python": 'echo "python $*" >> "$SHIM_LOG"\n',
}


def install_shims(directory: Path) -> Path:
    """Write the shims into ``directory``; return the log each call appends one line to (``SHIM_LOG`` must name it;
    ``scontrol show hostnames`` prints ``SHIM_NODES``)."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, body in SHIMS.items():
        shim = directory / name
        shim.write_text(f"#!/bin/bash\n{body}")
        shim.chmod(0o755)
    return directory / "calls.log"
