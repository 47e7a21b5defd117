"""Coded sharding over GF(2**31 - 1): quantisation, Lagrange encoding, decoding, tags.

numpy in, numpy out.  See :mod:`coding.field`, :mod:`coding.lagrange`,
:mod:`coding.decode` and :mod:`coding.auth`.
"""

from .auth import (
    access_key,
    key_proof,
    new_key,
    new_nonce,
    slice_tag,
    verify_key_proof,
    verify_slice_tag,
)
from .decode import DecodingError, berlekamp_welch, decode_erasures, decode_errors
from .field import (
    DEFAULT_SCALE_BITS,
    MAX_MAGNITUDE,
    PRIME,
    QuantizationRangeError,
    dequantize,
    gf,
    quantization_step,
    quantize,
)
from .lagrange import (
    encode,
    encode_quantized,
    encoding_matrix,
    evaluation_points,
    lagrange_matrix,
    pad_private,
    random_field_elements,
)

__all__ = [
    "PRIME",
    "MAX_MAGNITUDE",
    "DEFAULT_SCALE_BITS",
    "QuantizationRangeError",
    "quantize",
    "dequantize",
    "quantization_step",
    "gf",
    "evaluation_points",
    "encoding_matrix",
    "lagrange_matrix",
    "encode",
    "encode_quantized",
    "pad_private",
    "random_field_elements",
    "DecodingError",
    "decode_erasures",
    "decode_errors",
    "berlekamp_welch",
    "new_key",
    "new_nonce",
    "access_key",
    "slice_tag",
    "verify_slice_tag",
    "key_proof",
    "verify_key_proof",
]
