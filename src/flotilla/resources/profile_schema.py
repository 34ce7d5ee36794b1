"""Schema of ServingDeployment spec.profile: owned by the serving planner's profile format."""

from flotilla.serving.profile import OPENAPI_SCHEMA as PROFILE_SCHEMA

__all__ = ["PROFILE_SCHEMA"]
