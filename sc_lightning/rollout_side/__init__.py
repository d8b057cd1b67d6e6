"""The rollout side, Lightning-free: ``side`` (RolloutSide: data plane, engines, controller, refits, start and stop
order), ``parts`` (what it reads of the model, the optional parts a config asks for, the refit record), ``banner``
(the start banner). Lightning's strategies hold one RolloutSide; plain Python can drive one too (see ``side``)."""
