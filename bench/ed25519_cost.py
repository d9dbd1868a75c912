"""CPU per Ed25519 verification: ``cryptography`` (OpenSSL, what ``lockd.tokens`` uses) against
PyNaCl (libsodium) when it can be imported (not a test; not a dependency of the project)::

    pip install --target /tmp/nacl pynacl      # a scratch directory, not the venv
    python -m bench.ed25519_cost [--nacl-path /tmp/nacl]

Best of 5 runs of 3,000 verifications of one valid signature over 200 bytes, process CPU time.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

__all__ = ["main"]


def _cpu_us(call: Callable[[], object], n: int = 3000) -> float:
    best = float("inf")
    for _ in range(5):
        start = time.process_time()
        for _ in range(n):
            call()
        best = min(best, (time.process_time() - start) / n)
    return best * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ed25519_cost", description=__doc__)
    parser.add_argument("--nacl-path", default=None, help="where PyNaCl was installed")
    args = parser.parse_args(argv)
    key = Ed25519PrivateKey.generate()
    public = key.public_key()
    message = b"x" * 200
    signature = key.sign(message)
    print(f"cryptography (OpenSSL) Ed25519PublicKey.verify  "
          f"{_cpu_us(lambda: public.verify(signature, message)):6.1f} µs")
    if args.nacl_path:
        sys.path.insert(0, args.nacl_path)
    try:
        import nacl.signing
    except ImportError:
        print("PyNaCl not importable: --nacl-path DIR after pip install --target DIR pynacl")
        return 0
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    verify_key = nacl.signing.VerifyKey(raw)
    print(f"PyNaCl (libsodium) VerifyKey.verify             "
          f"{_cpu_us(lambda: verify_key.verify(message, signature)):6.1f} µs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
