"""The ``ensemble`` model's wiring, checked the way Triton's ensemble scheduler resolves it at load time."""

from __future__ import annotations

from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from trtllm_kit.model_repo.report import ValidationReport


def check_ensemble(repo: Path, configs: dict[str, mc.ModelConfig], report: ValidationReport) -> None:
    """Every step's model exists, its input_map reads tensors that exist by then with the same type, its required
    inputs are mapped, its output_map names real outputs, and every ensemble output is produced with its type.

    Arguments:
        repo: the repository; configs: the parsed configs by model name; report: where findings go.
    """
    ens = configs.get("ensemble")
    unparsed = {s.model_name for s in ens.ensemble_scheduling.step} - set(configs) if ens else set()
    if ens is None or any((repo / name / "config.pbtxt").is_file() for name in unparsed):
        return  # a step that does not parse is reported already; its wiring cannot be checked
    known = {t.name: t.data_type for t in ens.input}
    produced: set[str] = set()
    for number, step in enumerate(ens.ensemble_scheduling.step, 1):
        model = configs.get(step.model_name)
        if model is None:
            report.add("error", "ensemble", "ensemble", f"step {number} calls {step.model_name!r}, which is not "
                       "in the repository; add it or fix model_name.")
            continue
        inputs, outputs = {t.name: t for t in model.input}, {t.name: t for t in model.output}
        for key, value in sorted(step.input_map.items()):
            if key not in inputs:
                report.add("error", "ensemble", "ensemble", f"step {number} ({step.model_name}) maps {value!r} to "
                           f"{key!r}, which is not an input of {step.model_name}; fix input_map.")
            elif value not in known:
                report.add("error", "ensemble", "ensemble", f"step {number} ({step.model_name}) reads {value!r}, "
                           "which no ensemble input or earlier step provides; fix input_map.")
            elif known[value] != inputs[key].data_type:
                report.add("error", "ensemble", "ensemble", f"step {number} feeds {value!r} "
                           f"({mc.DataType.Name(known[value])}) into {step.model_name}.{key} "
                           f"({mc.DataType.Name(inputs[key].data_type)}); the types must match.")
        for key in (n for n, t in inputs.items() if not t.optional and n not in step.input_map):
            report.add("error", "ensemble", "ensemble", f"step {number} leaves the required input "
                       f"{step.model_name}.{key} unmapped; add it to input_map.")
        for key, value in sorted(step.output_map.items()):
            if key not in outputs:
                report.add("error", "ensemble", "ensemble", f"step {number} maps {key!r} to {value!r}, but "
                           f"{step.model_name} has no output {key!r}; fix output_map.")
                continue
            known[value] = outputs[key].data_type
            produced.add(value)
    for tensor in ens.output:
        if tensor.name not in produced:
            report.add("error", "ensemble", "ensemble", f"ensemble output {tensor.name!r} is produced by no step; "
                       "map a step output to it or remove it.")
        elif known[tensor.name] != tensor.data_type:
            report.add("error", "ensemble", "ensemble", f"ensemble output {tensor.name!r} is declared "
                       f"{mc.DataType.Name(tensor.data_type)} but its step produces "
                       f"{mc.DataType.Name(known[tensor.name])}; the types must match.")
    for step in ens.ensemble_scheduling.step:
        model = configs.get(step.model_name)
        if model is not None and ens.max_batch_size > model.max_batch_size:
            report.add("error", "ensemble", "max_batch_size", f"ensemble max_batch_size {ens.max_batch_size} "
                       f"exceeds {step.model_name}'s {model.max_batch_size}; Triton refuses that: lower it.")
