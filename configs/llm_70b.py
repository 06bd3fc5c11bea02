"""LLaMA-3-70B shape (70.55B parameters), synthetic tokens until a real tokenizer is set.

    axtrain --config=configs/llm_70b.py --print_config
    axtrain --config=configs/llm_70b.py --mesh=tpu-v5p-1024
    axtrain plan --config=configs/llm_70b.py --mesh=gpu-h100-8x16
"""

from configs import llama
from core.config_args import parse_arg


def get_config(arg=None):
  parse_arg(arg)  # takes no arguments (configs/llama.py:size=NAME reaches every size)
  return llama.get_config("size=70b")
