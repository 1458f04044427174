"""The fifth batch's mechanism without vLLM or a GPU: a torch.compile'd function calling a custom op that has no fake
implementation keeps its caller's frames (and their tensors) after they return, until a full collection; with a
fake implementation registered it does not.

    python cycle_repro.py          # the op without a fake implementation (vLLM 0.19.0-0.29.0's _moe_C::grouped_topk)
    python cycle_repro.py fake     # with one (register_fake, as 0.30.0 registers for grouped_topk)

It prints whether a 40 MB tensor local to the caller is still alive after the caller returned, after a young
collection (what Dynamo runs when a compile ends) and after a full one, and in which collector generation the
fake-tensor fallback's exceptions are. In vLLM the caller is the MoE layer's call and the outcome varies between
startups; in this small process the exceptions reach the oldest generation during the compile every time.
"""

import gc
import sys
import weakref

import torch

lib = torch.library.Library("_repro", "DEF")
lib.define("topk_ids(Tensor x) -> Tensor")
lib.impl("topk_ids", lambda x: x.topk(2)[1].to(torch.int32), "CPU")
if sys.argv[1:] == ["fake"]:
    torch.library.register_fake("_repro::topk_ids")(lambda x: x.new_empty((x.shape[0], 2), dtype=torch.int32))


@torch.compile(dynamic=True)
def grouped_topk(x):
    return torch.ops._repro.topk_ids(torch.softmax(x, -1))


refs = []


def moe_call():
    activations = torch.empty(10_000_000)  # stands for the MoE call's (N, K) tensors
    refs.append(weakref.ref(activations))
    return grouped_topk(torch.randn(8, 16))


moe_call()
generations = sorted(
    (g, type(o).__name__)
    for g in range(3)
    for o in gc.get_objects(g)
    if type(o).__name__ in ("UnsupportedOperatorException", "NotImplementedError")
)
alive = refs[0]() is not None
gc.collect(1)
after_young = refs[0]() is not None
gc.collect()
after_full = refs[0]() is not None
print(f"torch {torch.__version__}; fake implementation: {sys.argv[1:] == ['fake']}")
print(f"fallback exceptions (generation, type): {generations}")
print(f"caller's tensor alive after return: {alive}; after gc.collect(1): {after_young}; after gc.collect(): {after_full}")
