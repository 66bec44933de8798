"""kimideploy: the EAGLE-3 speculative-decoding lifecycle for Kimi-K2.5 on Kubernetes."""

__version__ = "0.1.0"
