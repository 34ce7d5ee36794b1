"""Property-based fuzzing of the OpenAPI schema (schemathesis): no input makes the API answer 5xx."""

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.checks import not_a_server_error

from controller_fixtures import ADMIN, auth, node, serving, training_job
from flotilla.controller.api import create_app
from flotilla.controller.mirror import parse_node, parse_serving_deployment, parse_training_job


@pytest.mark.parametrize("migrated_db_url", ["sqlite"], indirect=True)
def test_no_input_gives_a_server_error(controller, store):
    store.upsert_node(parse_node(node("a")))
    store.upsert_job(parse_training_job(training_job("j1", placement={"a": 4})))
    store.upsert_serving(parse_serving_deployment(serving("s1")))
    schema = schemathesis.openapi.from_asgi("/openapi.json", create_app(controller))
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) == 29  # every route of test_api.ROUTES, /healthz and /readyz

    for operation in operations:  # 25 generated requests per route: a few seconds in all
        @given(case=operation.as_strategy())
        @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True,
                  phases=[Phase.explicit, Phase.generate], database=None)  # no shrinking: bounded time
        def fuzz(case):
            case.call_and_validate(headers=auth(ADMIN), checks=[not_a_server_error])

        fuzz()
