"""Export pipeline: translations built from the registry, graph checks, function attachment."""

from exporters.export import export

__all__ = ["export"]
