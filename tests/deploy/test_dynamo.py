"""``deploy dynamo``: DynamoGraphDeployments validated against Dynamo's saved CRD, worker argv as upstream's."""

from __future__ import annotations

from typing import Any

from trtllm_kit.deploy.validate import check_object

DGD = {"apiVersion": "nvidia.com/v1beta1", "kind": "DynamoGraphDeployment", "metadata": {"name": "m"},
       "spec": {"backendFramework": "trtllm",
                "components": [{"name": "Frontend", "type": "frontend", "replicas": 1,
                                "podTemplate": {"spec": {"containers": [{"name": "main", "image": "img"}]}}}]}}


def test_saved_crd_accepts_upstream_shape_and_refuses_unknown_fields() -> None:
    assert check_object(DGD, "dgd.yaml") == []
    bad: dict[str, Any] = {**DGD, "spec": {**DGD["spec"], "services": {}}}
    [finding] = check_object(bad, "dgd.yaml")
    assert "services" in finding.message
    wrong_type = {**DGD, "spec": {**DGD["spec"], "components": [{"name": "x", "type": "router"}]}}
    assert any("router" in f.message for f in check_object(wrong_type, "dgd.yaml"))
