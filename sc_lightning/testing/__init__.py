"""Test support: fakes for what cannot run here (named as fakes). The package itself never imports this."""
