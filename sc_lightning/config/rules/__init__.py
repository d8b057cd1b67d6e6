"""The cross-field rules of a config, one small function each (``rule(config, report)``, its knobs named by ``@ties``).

By block: :mod:`~sc_lightning.config.rules.algo` (the algorithm blocks and the step's batch, with the models,
engine, losses and PPO rules of :mod:`~sc_lightning.config.rules.model`), :mod:`~sc_lightning.config.rules.runtime`
(the async runtime, with the environment rules of :mod:`~sc_lightning.config.rules.env`),
:mod:`~sc_lightning.config.rules.multiturn`, :mod:`~sc_lightning.config.rules.distillation` (on-policy
distillation's teachers) and :mod:`~sc_lightning.config.rules.vlm` (prompts with images).
:func:`sc_lightning.config.validate.check_config` runs :data:`RULES`.
"""

from sc_lightning.config.rules.algo import ALGORITHM_RULES
from sc_lightning.config.rules.distillation import DISTILLATION_RULES
from sc_lightning.config.rules.multiturn import MULTITURN_RULES
from sc_lightning.config.rules.runtime import RUNTIME_RULES
from sc_lightning.config.rules.vlm import VLM_RULES

RULES = (*ALGORITHM_RULES, *RUNTIME_RULES, *MULTITURN_RULES, *DISTILLATION_RULES, *VLM_RULES)
"""Every rule, in the order validation runs them (and the reference lists them)."""
