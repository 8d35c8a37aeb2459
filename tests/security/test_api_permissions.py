"""The API → ACL check table covers every API the node serves, with checks an ACL can grant."""

from __future__ import annotations

from shale.sidecar.protocol import error_codes as E
from shale.sidecar.protocol.codec import SUPPORTED_VERSIONS
from shale.sidecar.security.acl import SUPPORTED_OPERATIONS
from shale.sidecar.security.acl import AclOperation as O
from shale.sidecar.security.acl import ResourceType as R
from shale.sidecar.security.api_permissions import API_PERMISSIONS, Check
from shale.sidecar.security.sasl import PRE_AUTHENTICATION_APIS

SECURITY_APIS = {17, 29, 30, 31, 36, 50, 51}  # to be served when security is wired in


def all_checks(check: Check):
    while check is not None:
        yield check
        check = check.otherwise


def test_every_served_api_has_a_row():
    assert set(SUPPORTED_VERSIONS) | SECURITY_APIS <= set(API_PERMISSIONS)


def test_only_the_pre_authentication_apis_check_nothing():
    assert {k for k, checks in API_PERMISSIONS.items() if not checks} == PRE_AUTHENTICATION_APIS == {17, 18, 36}


def test_every_check_is_grantable_and_answers_an_authorization_error():
    authorization_errors = {E.TOPIC_AUTHORIZATION_FAILED, E.GROUP_AUTHORIZATION_FAILED,
                            E.CLUSTER_AUTHORIZATION_FAILED, E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED}
    for key, checks in API_PERMISSIONS.items():
        for first in checks:
            for c in all_checks(first):
                assert c.operation in SUPPORTED_OPERATIONS[c.resource_type], (key, c)
                assert c.error_code in authorization_errors, (key, c)


def test_rows_of_the_spec():
    def ops(key):
        return [(c.operation, c.resource_type, c.per_item) for first in API_PERMISSIONS[key] for c in all_checks(first)]

    assert ops(0) == [(O.WRITE, R.TRANSACTIONAL_ID, False), (O.WRITE, R.TOPIC, True)]
    assert ops(19) == [(O.CREATE, R.CLUSTER, True), (O.CREATE, R.TOPIC, True), (O.DESCRIBE_CONFIGS, R.TOPIC, True)]
    assert ops(16) == [(O.DESCRIBE, R.CLUSTER, False), (O.DESCRIBE, R.GROUP, True)]
    assert API_PERMISSIONS[16][0].otherwise.filters  # ListGroups never fails: it filters
    idempotent = API_PERMISSIONS[22][1]
    assert (idempotent.operation, idempotent.otherwise.any_resource, idempotent.otherwise.error_code) == (
        O.IDEMPOTENT_WRITE, True, E.CLUSTER_AUTHORIZATION_FAILED)
    follower = API_PERMISSIONS[1][0]
    assert (follower.operation, follower.error_code) == (O.CLUSTER_ACTION, E.TOPIC_AUTHORIZATION_FAILED)
    assert all(ops(k) == [(O.READ, R.GROUP, False)] for k in (11, 12, 13, 14))
    assert ops(30) == ops(31) == ops(51) == [(O.ALTER, R.CLUSTER, False)]
