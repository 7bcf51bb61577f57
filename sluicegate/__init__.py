"""sluicegate: an Envoy control plane and ext_proc filter for LLM traffic."""

__version__ = "0.1.0"
