"""Flotilla: a Kubernetes control plane for shared GPU clusters."""

__version__ = "0.1.0"

GROUP = "flotilla.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
