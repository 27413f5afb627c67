"""``deploy k8s``, ``dynamo``, ``ray``, ``check`` and ``leader``: Kubernetes objects from an artifact, re-validated;
``deploy try`` lives in ``deploy_try``, ``deploy simulate`` in ``deploy_simulate``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from trtllm_kit.commands.build_flags import given
from trtllm_kit.commands.deploy_simulate import simulate
from trtllm_kit.commands.deploy_try import try_pods
from trtllm_kit.commands.output import emit_json
from trtllm_kit.errors import KitError

# Each command imports the library inside its function, so that `trtllm-kit --help` and every command load
# only what they run (torch, transformers, tritonclient and matplotlib take seconds to import).


def _stacked(*decorators: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """The decorators as one, applied so that their options list in the order given."""
    def apply(command: Any) -> Any:
        for decorator in reversed(decorators):
            command = decorator(command)
        return command
    return apply


# what every writer of objects takes first: the artifact, where its objects go, their names, how pods get it
_artifact_objects = _stacked(
    click.argument("artifact", type=click.Path(path_type=Path)),
    click.option("--out", type=click.Path(path_type=Path), required=True, help="The directory to write (kustomize)."),
    click.option("--config", "config", type=click.Path(path_type=Path),
                 help="A trtllm-kit.toml with a [deploy] table."),
    click.option("--name", help="Object name (default: from the model)."),
    click.option("--namespace", help="Namespace (default: default)."),
    click.option("--artifact-url", help="A .tar of the build output, fetched by an init container."),
    click.option("--pvc", help="A PersistentVolumeClaim holding the build output at its root."))
# what the cluster is and needs on every serving pod
_cluster = _stacked(
    click.option("--k8s-version", help="The cluster's Kubernetes version (default 1.33): the schemas, the preStop "
                 "sleep action (1.30+), native sidecars (1.29+)."),
    click.option("--keda-version", help="The cluster's KEDA version (default 2.17): fallback.behavior needs 2.17+."),
    click.option("--toleration", "tolerations", multiple=True, metavar="KEY[=VALUE][:EFFECT]",
                 help="A toleration for every serving pod; repeatable."),
    click.option("--network", "networks", multiple=True, metavar="[NS/]NAME[@IF]", help="A Multus "
                 "NetworkAttachmentDefinition attached to every serving pod (k8s.v1.cni.cncf.io/networks); "
                 "repeatable."),
    click.option("--add-capability", "capabilities", multiple=True, type=click.Choice(["IPC_LOCK"]),
                 help="A capability for the server containers (IPC_LOCK: RDMA memory registration); they then run "
                 "as uid 0 with every other capability dropped."))
# and last: replacing --out, the JSON listing, the click context (for which flags were given)
_written = _stacked(
    click.option("--force", is_flag=True, help="Replace an existing --out."),
    click.option("--json", "as_json", is_flag=True, help="List what was written as JSON."),
    click.pass_context)


@click.group()
def deploy() -> None:
    """Deploy an artifact on Kubernetes (or on NVIDIA Dynamo): write the objects, check them, replay the autoscaler.

    \b
    Example:
      trtllm-kit deploy k8s out/ --out k8s/ --pvc models --gpus-per-node 4 --autoscaler keda
      trtllm-kit deploy check k8s/
      sudo trtllm-kit deploy try k8s/ --pvc-dir models=out/
      kubectl apply -k k8s/
      trtllm-kit deploy dynamo out/ --out dgd/ --pvc models --image IMG --disagg --decode-tp 8
    """


@deploy.command(name="k8s")
@_artifact_objects
@click.option("--image", help="The serving image built from docker/Dockerfile, in your registry, tagged "
              "NAME:KITVERSION-trtllmX.Y.Z (required).")
@click.option("--image-trtllm-version", help="The image's TensorRT-LLM version when its tag does not say it.")
@click.option("--gpu-product", help="Pin the pods to this nvidia.com/gpu.product (engines: must be their build GPU).")
@click.option("--gpus-per-node", type=int, help="GPUs of one node (default 8); more ranks span nodes.")
@click.option("--min-replicas", type=int, help="Replicas (groups on several nodes) at least (default 1; 0 scales to "
              "zero through KEDA's HTTP add-on).")
@click.option("--max-replicas", type=int, help="Replicas at most (default 4).")
@click.option("--autoscaler", type=click.Choice(["keda", "hpa", "none"]), help="What scales (default keda).")
@click.option("--openai-port", type=int, help="The OpenAI frontend's port (default 9000).")
@click.option("--queue-target", type=float, help="Waiting requests per replica to scale at (default 4).")
@click.option("--ttft-slo", "ttft_slo_s", type=float, help="Seconds of p90 time to first token above which an alert "
              "fires (default 2).")
@click.option("--prometheus-url", help="Prometheus for KEDA (default: prometheus-operated.monitoring.svc:9090).")
@click.option("--load-gbps", type=float, help="Aggregate read rate (GB/s) of the volume the weights are read from, "
              "shared by every rank reading it at once (default 0.5); sets the startup budget.")
@click.option("--worker-wait", "worker_wait_s", type=int, help="Seconds a multi-node leader waits for its workers, "
              "inside its startup budget (default 600).")
@click.option("--topology-key", help="A node label whose domain holds a whole multi-node group, one group per "
              "domain; every node must carry it (default: none, groups placed freely).")
@click.option("--rdma-resource", "rdma_resources", multiple=True, metavar="NAME=N", help="An extended resource every "
              "pod of a multi-node group requests (rdma/ib=1, vpc.amazonaws.com/efa=32); repeatable.")
@click.option("--nccl-env", "nccl_env", multiple=True, metavar="K=V", help="An environment variable for every "
              "multi-node pod, forwarded to every rank (NCCL_IB_HCA=mlx5); repeatable.")
@click.option("--ssh-secret", help="A Secret with id_ed25519 and id_ed25519.pub for the group's ssh (default: a "
              "fresh pair in OUT/ssh, applied by kustomize).")
@click.option("--monitor-labels", "monitor_labels", multiple=True, metavar="K=V", help="A label for the PodMonitor "
              "and PrometheusRule that the Prometheus operator selects (default release=prometheus); repeatable.")
@click.option("--fallback-replicas", type=int, help="Replicas KEDA keeps at least while its query fails (default "
              "--min-replicas; more running ones stay).")
@click.option("--router", type=click.Choice(["kube-proxy", "inference-extension"]), help="How requests spread over "
              "replicas: the Service's round-robin (default), or a Gateway API Inference Extension InferencePool "
              "whose endpoint picker reads each replica's queue and KV cache, with an HTTPRoute from --gateway.")
@click.option("--gateway", help="The Gateway the HTTPRoute attaches to (--router inference-extension; default "
              "inference-gateway).")
@click.option("--api-keys-secret", help="A Secret whose keys.json (trtllm-kit keys add ... --keys keys.json) the "
              "OpenAI API requires keys from; the usage log streams to a sidecar's stdout as JSON lines.")
@_cluster
@_written
def k8s(ctx: click.Context, artifact: Path, out: Path, config: Path | None, force: bool, as_json: bool,
        **flags: Any) -> None:
    """Write the Kubernetes objects serving ARTIFACT (a trtllm-kit build output) into a kustomize directory.

    \b
    Example:
      trtllm-kit deploy k8s out/ --out k8s/ --artifact-url https://files.example/out.tar --autoscaler hpa
    """
    from trtllm_kit.deploy.render import render
    from trtllm_kit.deploy.settings import deploy_settings, deploy_table
    from trtllm_kit.deploy.source import read_source

    table = deploy_table(config) if config is not None else {}
    settings = deploy_settings(table, given(ctx, **flags))
    rendered = render(read_source(artifact), settings, out, force=force)
    if as_json:
        emit_json(rendered.to_dict())
        return
    layout = (f"LeaderWorkerSet of {rendered.num_nodes} pods per replica" if rendered.num_nodes > 1
              else "Deployment, one pod per replica")
    click.echo(f"wrote {len(rendered.resources) + len(rendered.extras)} files to {rendered.out} ({layout}; "
               f"valid for Kubernetes {rendered.record['kubernetes']}); apply with kubectl apply -k {out}")


@deploy.command(name="dynamo")
@_artifact_objects
@click.option("--image", help="A Dynamo TensorRT-LLM runtime image (nvcr.io/nvidia/ai-dynamo/tensorrtllm-runtime:TAG; "
              "required).")
@click.option("--gpus-per-node", type=int, help="GPUs of one node (default 8); a role with more ranks spans nodes.")
@click.option("--monitor-labels", "monitor_labels", multiple=True, metavar="K=V", help="A label for the PodMonitor "
              "that the Prometheus operator selects (default release=prometheus); repeatable.")
@click.option("--autoscaler", type=click.Choice(["keda", "none"]), help="What scales each worker role, through "
              "Dynamo's scaling adapter (default keda).")
@click.option("--min-replicas", type=int, help="Workers per role at least, when scaled (default 1).")
@click.option("--max-replicas", type=int, help="Workers per role at most, when scaled (default 4).")
@click.option("--queue-target", type=float, help="Requests queued at the frontend per prefill (or aggregated) "
              "worker to scale at (default 4); decode scales at the artifact's max batch in flight per worker.")
@click.option("--prometheus-url", help="Prometheus for KEDA (default: prometheus-operated.monitoring.svc:9090).")
@click.option("--fallback-replicas", type=int, help="Workers KEDA keeps at least while its query fails.")
@click.option("--replicas", "worker_replicas", type=int, default=1, show_default=True,
              help="Aggregated workers.")
@click.option("--disagg", is_flag=True, help="Separate prefill and decode workers (the KV moves between them).")
@click.option("--prefill-replicas", type=int, default=1, show_default=True, help="Prefill workers (--disagg).")
@click.option("--decode-replicas", type=int, default=1, show_default=True, help="Decode workers (--disagg).")
@click.option("--prefill-tp", type=int, help="Prefill TP (--disagg; default the artifact's).")
@click.option("--decode-tp", type=int, help="Decode TP (--disagg; default the artifact's).")
@_cluster
@_written
def dynamo(ctx: click.Context, artifact: Path, out: Path, config: Path | None, worker_replicas: int, disagg: bool,
           prefill_replicas: int, decode_replicas: int, prefill_tp: int | None, decode_tp: int | None, force: bool,
           as_json: bool, **flags: Any) -> None:
    """Write a Dynamo DynamoGraphDeployment serving ARTIFACT (an llmapi build output), aggregated or with
    separate prefill and decode workers.

    \b
    Example:
      trtllm-kit deploy dynamo out/ --out dgd/ --pvc models --image IMG --disagg --prefill-replicas 3 \\
        --decode-replicas 1 --decode-tp 8
      trtllm-kit deploy check dgd/
    """
    from trtllm_kit.deploy.dynamo import render_graph
    from trtllm_kit.deploy.dynamo_roles import roles_for
    from trtllm_kit.deploy.settings import deploy_settings, deploy_table
    from trtllm_kit.deploy.source import read_source

    table = deploy_table(config) if config is not None else {}
    settings = deploy_settings(table, given(ctx, **flags))
    source = read_source(artifact)
    roles = roles_for(source, disagg=disagg, replicas=worker_replicas, prefill_replicas=prefill_replicas,
                      decode_replicas=decode_replicas, prefill_tp=prefill_tp, decode_tp=decode_tp)
    graph = render_graph(source, settings, roles, out, force=force)
    if as_json:
        emit_json(graph.to_dict())
        return
    workers = ", ".join(f"{r.replicas} x {r.name} (tp {r.tp_size}, {r.num_nodes(settings.gpus_per_node)} node(s))"
                        for r in roles)
    click.echo(f"wrote {len(graph.resources)} files to {graph.out} (DynamoGraphDeployment {graph.name}: {workers}); "
               f"apply with kubectl apply -k {out}")


@deploy.command(name="ray")
@_artifact_objects
@click.option("--image", help="An image with CUDA, Ray, TensorRT-LLM and the kit for the head and the GPU workers "
              "(required).")
@click.option("--image-trtllm-version", help="The image's TensorRT-LLM version when its tag does not say it.")
@click.option("--gpus-per-node", type=int, help="GPUs of one node (default 8); a replica's GPUs must fit one.")
@click.option("--replicas", default="1:4", show_default=True, metavar="MIN:MAX",
              help="Replicas of the model deployment, one worker pod each (MIN 0 scales to zero).")
@click.option("--target-ongoing", type=float, help="Requests in flight per replica Ray Serve scales at (default: "
              "deploy k8s's --queue-target, 4).")
@click.option("--api-keys-secret", help="A Secret whose keys.json (trtllm-kit keys add ... --keys keys.json) the "
              "frontend on the head requires keys from; the usage log streams to a sidecar's stdout as JSON lines.")
@_cluster
@_written
def ray(ctx: click.Context, artifact: Path, out: Path, config: Path | None, replicas: str,
        target_ongoing: float | None, force: bool, as_json: bool, **flags: Any) -> None:
    """Write a KubeRay RayService serving ARTIFACT (an llmapi build output) on Ray Serve, its GPU worker group
    scaled by Ray's autoscaler.

    \b
    Example:
      trtllm-kit deploy ray out/ --out ray/ --pvc models --image IMG --replicas 1:4 --target-ongoing 4
      trtllm-kit deploy check ray/
    """
    from trtllm_kit.deploy.ray import render_ray
    from trtllm_kit.deploy.settings import deploy_settings, deploy_table
    from trtllm_kit.deploy.source import read_source
    from trtllm_kit.serve.ray.scaling import Autoscaling

    table = deploy_table(config) if config is not None else {}
    settings = deploy_settings(table, given(ctx, **flags))
    scaling = Autoscaling.parse(replicas, target_ongoing if target_ongoing is not None else settings.queue_target)
    written = render_ray(read_source(artifact), settings, scaling, out, force=force)
    if as_json:
        emit_json(written.to_dict())
        return
    click.echo(f"wrote {len(written.resources)} files to {written.out} (RayService {written.name}: "
               f"{scaling.min_replicas}..{scaling.max_replicas} replicas of {written.gpus_per_replica} GPU(s)); "
               f"apply with kubectl apply -k {out}")


@deploy.command(name="check")
@click.argument("directory", type=click.Path(path_type=Path))
@click.option("--kubernetes", "--k8s-version", "kubernetes", help="The cluster's Kubernetes version (default: the one "
              "DIRECTORY was written for, else 1.33): its schemas, and the features it runs.")
@click.option("--keda-version", help="The cluster's KEDA version (default: the one DIRECTORY was written for, else "
              "2.17).")
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON.")
def check(directory: Path, kubernetes: str | None, keda_version: str | None, as_json: bool) -> None:
    """Re-validate a deploy directory after hand edits: strict schemas for every object, the kit's lints, and the
    features the cluster's Kubernetes and KEDA versions cannot run.

    \b
    Example:
      trtllm-kit deploy check k8s/ --k8s-version 1.29 --keda-version 2.16
    """
    from trtllm_kit.deploy.render import check_dir, dir_versions

    versions = dir_versions(directory, kubernetes, keda_version)
    num_objects, findings = check_dir(directory, kubernetes, keda_version)
    keda = f"{versions.keda[0]}.{versions.keda[1]}"
    if as_json:
        emit_json({"objects": num_objects, "kubernetes": versions.kubernetes_text, "keda": keda,
                   "findings": [str(f) for f in findings]})
    else:
        for finding in findings:
            click.echo(str(finding), err=True)
        click.echo(f"{num_objects} objects checked against Kubernetes {versions.kubernetes_text}, KEDA {keda} and "
                   f"the saved CRDs: {len(findings)} problem(s)")
    if findings:
        raise KitError(f"{directory} has {len(findings)} problem(s), the first: {findings[0]}")


@deploy.command(name="leader")
@click.argument("plan", type=click.Path(path_type=Path))
def leader(plan: Path) -> None:
    """Run a multi-node group's leader (the command deploy k8s gives the leader pod): wait for the workers, start
    every rank with mpirun over ssh, serve beside rank 0, stop the ranks on SIGTERM.

    \b
    Example (inside the pod):
      trtllm-kit deploy leader /opt/trtllm-kit/plan.json
    """
    import os

    from trtllm_kit.deploy.leader import run_leader
    from trtllm_kit.deploy.leader_plan import LeaderPlan

    code = run_leader(LeaderPlan.read(plan), dict(os.environ))
    if code:
        raise KitError(f"the ranks exited with an error (code {code}); the group restarts.")


deploy.add_command(simulate)
deploy.add_command(try_pods)
