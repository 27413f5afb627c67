"""Stand-in for the ``tensorrt_llm`` model: decoupled, upstream tensor names, tokens at a fixed pace.

Parameters (config.pbtxt): ``first_token_delay_ms`` (prefill time), ``token_delay_ms`` (decode step),
``tokens_per_chunk``. Each request streams ``request_output_len`` tokens at absolute times
``start + first + k * step`` and ends with the final response carrying ``num_output_tokens`` and the perf
timestamps. With ``streaming`` false it sends one response with all tokens.
"""

import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def _scalar(request, name, default):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return default if tensor is None else tensor.as_numpy().reshape(-1)[0].item()


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        value = lambda key, default: float(params.get(key, {}).get("string_value", default))  # noqa: E731
        self.first_s = value("first_token_delay_ms", 0) / 1000
        self.step_s = value("token_delay_ms", 0) / 1000
        self.per_chunk = int(value("tokens_per_chunk", 1))
        self.lock = threading.Lock()
        self.inflight = 0

    def execute(self, requests):
        for request in requests:
            arrival = time.time_ns()
            sender = request.get_response_sender()
            with self.lock:
                self.inflight += 1
            threading.Thread(target=self._generate, args=(request, sender, arrival), daemon=True).start()
        return None

    def _generate(self, request, sender, arrival):
        try:
            ids = pb_utils.get_input_tensor_by_name(request, "input_ids").as_numpy().reshape(-1)
            osl = int(_scalar(request, "request_output_len", 16))
            streaming = bool(_scalar(request, "streaming", False))
            start = time.monotonic()
            tokens = [(int(ids.sum()) + k) % 1000 + 3 for k in range(osl)]
            first_ns = None
            sent = 0
            while sent < osl:
                n = min(self.per_chunk, osl - sent) if streaming else osl
                due = start + self.first_s + (sent + n - 1) * self.step_s
                while (left := due - time.monotonic()) > 0:
                    time.sleep(left)
                if request.is_cancelled():
                    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                    return
                first_ns = first_ns or time.time_ns()
                chunk = np.array(tokens[sent:sent + n], np.int32).reshape(1, 1, n)
                sent += n
                outputs = [pb_utils.Tensor("output_ids", chunk),
                           pb_utils.Tensor("sequence_length", np.array([[n]], np.int32))]
                final = sent >= osl
                if final:
                    now = time.time_ns()
                    outputs += [pb_utils.Tensor("num_output_tokens", np.array([[osl]], np.int32))]
                    outputs += [pb_utils.Tensor(name, np.array([[v]], np.int64)) for name, v in (
                        ("arrival_time_ns", arrival), ("first_scheduled_time_ns", arrival + 1000),
                        ("first_token_time_ns", first_ns), ("last_token_time_ns", now))]
                flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0
                sender.send(pb_utils.InferenceResponse(outputs), flags=flags)
        except Exception as exc:
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(repr(exc))),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        finally:
            with self.lock:
                self.inflight -= 1

    def finalize(self):
        for _ in range(100):
            with self.lock:
                if self.inflight == 0:
                    return
            time.sleep(0.02)
