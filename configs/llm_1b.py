"""LLaMA-3.2-1B shape (1.24B parameters), synthetic tokens until a real tokenizer is set.

    axtrain --config=configs/llm_1b.py --print_config
    axtrain --config=configs/llm_1b.py --mesh=gpu-h100-8
    axtrain plan --config=configs/llm_1b.py --mesh=tpu-v5e-16
"""

from configs import llama
from core.config_args import parse_arg


def get_config(arg=None):
  parse_arg(arg)  # takes no arguments (configs/llama.py:size=NAME reaches every size)
  return llama.get_config("size=1b")
