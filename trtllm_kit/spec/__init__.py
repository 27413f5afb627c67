"""Build specifications: one dataclass per ``trtllm-kit.toml`` table, each option declared once; read from the
file and/or CLI flags (flags win)."""

from trtllm_kit.spec.build_spec import STAGES, TABLES, BuildSpec, all_declared, nest_flat_spec
from trtllm_kit.spec.config_file import build_spec, load_table, load_toml, merge
from trtllm_kit.spec.tables import BuildOptions, QuantOptions, ServeSettings

__all__ = ["STAGES", "TABLES", "BuildOptions", "BuildSpec", "QuantOptions", "ServeSettings", "all_declared",
           "build_spec", "load_table", "load_toml", "merge", "nest_flat_spec"]
