"""Schema of ServingDeployment spec.profile (the latency-model coefficients).

Until the serving planner defines its profile format, a profile is named
(a shipped profile) and may carry free-form coefficients.
"""

from flotilla.resources.schema import free_object, obj, string

PROFILE_SCHEMA = obj(
    {"name": string("A profile shipped with Flotilla.", min_length=1, max_length=128),
     "coefficients": free_object("Latency-model coefficients for this model on this hardware.")},
    "Latency profile of the model on its hardware.",
)
