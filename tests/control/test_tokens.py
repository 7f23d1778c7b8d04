import pytest
import sqlalchemy as sa

from tgc_rl.control import db
from tgc_rl.control.migrations import migrate
from tgc_rl.control.tokens import TokenStore


@pytest.fixture
def tokens(tmp_path) -> TokenStore:
    engine = db.make_engine(f"sqlite:///{tmp_path}/t.db")
    migrate(engine)
    return TokenStore(engine)


def test_token_authenticates_as_its_tenant(tokens):
    info, secret = tokens.create("acme", name="ci")
    principal = tokens.authenticate(secret)
    assert principal.tenant == "acme" and not principal.is_admin and principal.token_id == info.id


def test_only_the_hash_of_a_token_is_stored(tokens):
    _, secret = tokens.create("acme")
    with tokens.engine.connect() as conn:
        dump = " ".join(str(v) for row in conn.execute(sa.select(db.tokens)) for v in row)
    assert secret not in dump and secret[4:] not in dump


def test_unknown_and_revoked_tokens_do_not_authenticate(tokens):
    info, secret = tokens.create("acme")
    assert tokens.authenticate(secret + "x") is None
    assert tokens.revoke(info.id)
    assert tokens.authenticate(secret) is None
    assert not tokens.revoke(info.id)


def test_admin_token_is_marked_admin(tokens):
    _, secret = tokens.create("ops", is_admin=True)
    assert tokens.authenticate(secret).is_admin


def test_invalid_tenant_name_is_refused_with_the_rule(tokens):
    with pytest.raises(ValueError, match="lowercase letters"):
        tokens.create("Bad Tenant!")


def test_quota_is_stored_per_tenant(tokens):
    tokens.create("acme")
    assert tokens.quota("acme") is None
    tokens.set_quota("acme", 1)
    assert tokens.quota("acme") == 1 and tokens.quota("globex") is None
