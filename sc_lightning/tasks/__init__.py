"""Synthetic tasks as plain text: their problems, reference solutions and checks, shared by the datasets and
environments that pose them (``rollout/``) and the warm starts that teach them (``models/``); imports nothing else of
the package."""
