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


class _Context:
    """One thread's ChaCha20 context and buffers; the context is freed with it (at the thread's
    end, its `threading.local` goes)."""

    def __init__(self, lib: ctypes.CDLL, cipher: int) -> None:
        self._free = lib.EVP_CIPHER_CTX_free
        self.ctx = lib.EVP_CIPHER_CTX_new()
        if not self.ctx or lib.EVP_EncryptInit_ex(self.ctx, cipher, None, None, None) != 1:
            raise OSError("libcrypto: cannot make a ChaCha20 context")
        self.key = ctypes.create_string_buffer(32)
        self.out = ctypes.create_string_buffer(_SIZE)
        self.n = ctypes.c_int()

    def __del__(self) -> None:
        if self.ctx:
            self._free(self.ctx)


class _Lib:
    def __init__(self, lib: ctypes.CDLL) -> None:
        p = ctypes.c_void_p
        lib.EVP_CIPHER_CTX_new.restype = p
        lib.EVP_CIPHER_CTX_new.argtypes = []
        lib.EVP_CIPHER_CTX_free.restype = None
        lib.EVP_CIPHER_CTX_free.argtypes = [p]
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

    def _context(self) -> _Context:
        c: _Context | None = getattr(self.local, "c", None)
        if c is None:
            c = self.local.c = _Context(self.lib, self.cipher)
        return c

    def keystreams(self, datas: Iterable[bytes]) -> list[bytes]:
        """ChaCha20(SHA-256(d)) keystream, 384 bytes, for each of `datas`."""
        c = self._context()
        ctx, key, out, n = c.ctx, c.key, c.out, c.n
        sha, init, update = self.lib.SHA256, self.lib.EVP_EncryptInit_ex, self.lib.EVP_EncryptUpdate
        nref, nonce, zeros = ctypes.byref(n), _NONCE, _ZEROS
        res: list[bytes] = []
        for d in datas:
            # every step checked: a failed one would leave the last coin's keystream in `out`
            if (sha(d, len(d), key) is None or init(ctx, None, None, key, nonce) != 1
                    or update(ctx, out, nref, zeros, _SIZE) != 1 or n.value != _SIZE):  # fmt: skip
                raise OSError("libcrypto: ChaCha20 keystream failed")
            res.append(out.raw)
        return res


def load(reference: Callable[[bytes], bytes]) -> Keystreams | None:
    """The fast keystreams if libcrypto is here and agrees with `reference` (the keystream
    `element` is made of), else None."""
    if not sys.platform.startswith("linux"):  # macOS aborts a process that loads its libcrypto
        return None
    for name in _NAMES:
        try:
            lib = _Lib(ctypes.PyDLL(name))  # (PyDLL: the GIL stays held for calls of a µs)
            probe = [b"", b"utxoflow", bytes(range(256)) * 3]
            if lib.keystreams(probe) == [reference(d) for d in probe]:
                return lib.keystreams
        except (OSError, AttributeError):  # not there, or too old to have these functions
            continue
    return None
