"""Multi-turn rollouts (issue 21, foundations): the conversation record, chat templates, tools and environments.

Integration into the rollout manager and the trainer is in progress; see docs/multiturn.md.
"""
