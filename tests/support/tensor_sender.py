"""The sender side of SGLang's ``/update_weights_from_tensor`` (run by ``conformance.TensorPayload``):
``[(name, tensor), ...]`` from a ``torch.save`` file, pickled with torch's ``ForkingPickler`` (tensors
go by shared memory under the given sharing strategy), base64 written to a file; then it keeps the
tensors alive until its stdin closes.

Run: ``python tensor_sender.py NAMED.pt OUT.txt file_system|file_descriptor``."""

import base64
import io
import os
import sys

import torch
import torch.multiprocessing as mp  # registers torch's reductions with ForkingPickler
from multiprocessing.reduction import ForkingPickler


def main() -> int:
    source, out, strategy = sys.argv[1:4]
    mp.set_sharing_strategy(strategy)
    named = torch.load(source, weights_only=True)
    buffer = io.BytesIO()
    ForkingPickler(buffer).dump([(n, t.contiguous()) for n, t in named])
    tmp = out + ".tmp"
    with open(tmp, "w") as f:
        f.write(base64.b64encode(buffer.getvalue()).decode("ascii"))
    os.replace(tmp, out)
    sys.stdin.read()  # hold the shared tensors until the test is done with them
    return 0


if __name__ == "__main__":
    sys.exit(main())
