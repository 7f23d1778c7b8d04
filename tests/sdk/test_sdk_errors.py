import pytest

from tgc_rl.sdk import errors


@pytest.mark.parametrize(
    "status, cls",
    [
        (400, errors.Invalid),
        (401, errors.Unauthorized),
        (403, errors.Forbidden),
        (404, errors.NotFound),
        (409, errors.Conflict),
        (413, errors.TooLarge),
        (422, errors.Invalid),
        (429, errors.RateLimited),
        (500, errors.ServerError),
        (503, errors.ServerError),
    ],
)
def test_each_status_maps_to_its_error_type(status, cls):
    err = errors.error_for(status, {"error": "x", "message": "m"})
    assert type(err) is cls and err.status == status and err.message == "m"


def test_invalid_error_exposes_fields_and_messages():
    body = {
        "error": "invalid",
        "message": "invalid request",
        "detail": [{"field": "steps", "msg": "must be >= 1"}, {"field": "model.source", "msg": "unknown"}],
    }
    assert errors.error_for(422, body).fields == {"steps": "must be >= 1", "model.source": "unknown"}


def test_non_json_error_body_keeps_the_text():
    err = errors.error_for(502, None, "Bad Gateway")
    assert isinstance(err, errors.ServerError) and err.message == "Bad Gateway"


def test_wait_timeout_is_also_a_timeout_error():
    assert issubclass(errors.WaitTimeout, TimeoutError) and issubclass(errors.WaitTimeout, errors.TgcError)
