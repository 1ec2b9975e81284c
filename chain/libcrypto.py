"""MuHash's element in one pass through OpenSSL's libcrypto (the one Python's own `hashlib` and
`ssl` link), called through `ctypes`: SHA-256 of the data, then 384 bytes of ChaCha20 keystream
under that key, written into one reused buffer.

Why: `cryptography` builds a new cipher context for every key (about 6 of a coin's 8 µs); one
context re-keyed per coin costs about 2. This is `chain.muhash.element`'s fast form, not a second
definition: `keystreams()` is None (and callers use `cryptography`) unless the library loads on
Linux and reproduces `element` on a fixed vector at load — a wrong or missing libcrypto can only
make it slower, never different. Each thread has its own context and buffers.
"""

from __future__ import annotations

import ctypes
import sys
import threading
from collections.abc import Callable, Iterable

_SIZE = 384
_ZEROS = bytes(_SIZE)
_NONCE = bytes(16)  # the 4-byte block counter (0), then the 12-byte nonce (0): Core's stream
_NAMES = ("libcrypto.so.3", "libcrypto.so.1.1")  # OpenSSL 3 and 1.1 both have EVP_chacha20

Keystreams = Callable[[Iterable[bytes]], list[bytes]]


class _Lib:
    def __init__(self, lib: ctypes.CDLL) -> None:
        p = ctypes.c_void_p
        lib.EVP_CIPHER_CTX_new.restype = p
        lib.EVP_CIPHER_CTX_new.argtypes = []
        lib.EVP_chacha20.restype = p
        lib.EVP_chacha20.argtypes = []
        lib.EVP_EncryptInit_ex.restype = ctypes.c_int
        lib.EVP_EncryptInit_ex.argtypes = [p, p, p, p, p]
        lib.EVP_EncryptUpdate.restype = ctypes.c_int
        lib.EVP_EncryptUpdate.argtypes = [p, p, p, ctypes.c_char_p, ctypes.c_int]
        lib.SHA256.restype = p
        lib.SHA256.argtypes = [ctypes.c_char_p, ctypes.c_size_t, p]
        self.lib = lib
        self.cipher = lib.EVP_chacha20()
        self.local = threading.local()

    def _state(self) -> tuple[int, ctypes.Array[ctypes.c_char], ctypes.Array[ctypes.c_char], ctypes.c_int]:
        st = getattr(self.local, "st", None)
        if st is None:
            ctx = self.lib.EVP_CIPHER_CTX_new()
            if not ctx or self.lib.EVP_EncryptInit_ex(ctx, self.cipher, None, None, None) != 1:
                raise OSError("libcrypto: cannot make a ChaCha20 context")
            n = ctypes.c_int()
            st = self.local.st = (ctx, ctypes.create_string_buffer(32), ctypes.create_string_buffer(_SIZE), n)
        return st

    def keystreams(self, datas: Iterable[bytes]) -> list[bytes]:
        """ChaCha20(SHA-256(d)) keystream, 384 bytes, for each of `datas`."""
        ctx, key, out, n = self._state()
        sha, init, update = self.lib.SHA256, self.lib.EVP_EncryptInit_ex, self.lib.EVP_EncryptUpdate
        nref, nonce, zeros = ctypes.byref(n), _NONCE, _ZEROS
        res: list[bytes] = []
        for d in datas:
            # The return codes are not checked per coin (that is the cost we came to save): a
            # context that once worked re-keys without failing, and `load` checked one.
            sha(d, len(d), key)
            init(ctx, None, None, key, nonce)
            update(ctx, out, nref, zeros, _SIZE)
            res.append(out.raw)
        return res


def load(reference: Callable[[bytes], bytes]) -> Keystreams | None:
    """The fast keystreams if libcrypto is here and agrees with `reference` (the keystream
    `element` is made of), else None."""
    if not sys.platform.startswith("linux"):  # macOS aborts a process that loads its libcrypto
        return None
    for name in _NAMES:
        try:
            lib = _Lib(ctypes.CDLL(name))
            probe = [b"", b"utxoflow", bytes(range(256)) * 3]
            if lib.keystreams(probe) == [reference(d) for d in probe]:
                return lib.keystreams
        except (OSError, AttributeError):  # not there, or too old to have these functions
            continue
    return None
