"""The Lightning side of sc_lightning: strategy, the train-pump loop, modules and the CLI's trainer parser."""
