"""LoRA adapters as parts of an artifact: a PEFT adapter checked against the base, converted, and recorded."""
