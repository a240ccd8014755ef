"""A user's own training script, as the README shows it, started on a machine without a GPU and
without setting ``cfg.dist.device = "cpu"``: ``pretrain()`` must refuse it in one clear sentence."""

from megatron.bridge.recipes.qwen import qwen3_moe_tiny_pretrain_config
from megatron.bridge.training.errors import MachineError
from megatron.bridge.training.pretrain import pretrain

cfg = qwen3_moe_tiny_pretrain_config()
try:
    pretrain(cfg)
except MachineError as exc:
    print(f"refused: {exc}")
    raise SystemExit(3) from None
