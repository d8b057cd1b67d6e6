"""sc_lightning's test suite.

Every process that imports it (pytest's workers, and the multi-rank tests' spawned ranks, which import a test module
to find their function) imports torchmetrics as the CLI does, without its model-based metrics
(:func:`~sc_lightning.cli.lean_imports.leave_out_model_metrics`): the trainer's step totals import torchmetrics,
whose BERTScore alone imported transformers' auto models, about 5 of a rank's 18 seconds of imports on the 2-core box.
"""

from sc_lightning.cli.lean_imports import leave_out_model_metrics

leave_out_model_metrics()
