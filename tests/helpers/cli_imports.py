"""What the forkserver of :mod:`tests.helpers.warm_cli` imports before forking commands: the CLI's heavy imports,
the way a ``python -m sc_lightning fit`` process makes them (Lightning through the CLI's lean import first, then
megatron-core without compiling its fusers, then transformers' tokenizer and config classes). Their import-time
warnings are the server's, not a command's: they are silenced here.

Not Ray: it reads its settings from the environment when imported (its auth mode, which a test process's own
``ray.init`` sets for the clusters it starts), so each command imports it with its own environment."""

import sys
import warnings

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from sc_lightning.cli.lean_imports import import_lightning
    from sc_lightning.models.megatron_import import import_megatron_without_compile

    import_lightning()
    import_megatron_without_compile()

    from transformers import AutoConfig, AutoTokenizer  # noqa: F401

    import sc_lightning.cli.fit  # noqa: F401
    import sc_lightning.cli.main  # noqa: F401

if "ray" in sys.modules:
    raise RuntimeError("the CLI's preload imported Ray: a forked command would keep the server's Ray settings")
