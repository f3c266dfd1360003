"""A convolution part's signature: the fields cuDNN chooses its algorithm, and with it the
workspace, from, and the readable key the workspace table is kept by."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

PARTS = ("forward", "backward_input", "backward_weight", "backward_bias")
LAYOUTS = ("contiguous", "channels_last", "channels_last_3d", "strided")

_ITEMSIZE = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
             "float8_e4m3fn": 1, "float8_e5m2": 1}
# The key's short names for the signature's fields.
_KEY_NAMES = {"n": "batch", "in": "input", "w": "weight", "stride": "stride",
              "pad": "padding", "dil": "dilation", "groups": "groups",
              "transposed": "transposed", "out_pad": "output_padding", "dtype": "dtype",
              "layout": "layout", "benchmark": "benchmark",
              "deterministic": "deterministic", "tf32": "tf32", "cudnn": "cudnn"}
_SHAPES = ("input", "weight", "stride", "padding", "dilation", "output_padding")
_FLAGS = ("transposed", "benchmark", "deterministic", "tf32", "cudnn")


@dataclass(frozen=True)
class ConvSignature:
    """What decides one convolution part's workspace: cuDNN picks its algorithm, and with
    it the workspace, from these alone (and from the memory free, in benchmark mode)."""

    part: str                    # one of PARTS
    batch: int
    input: tuple                 # one sample: channels, then the spatial sizes
    weight: tuple                # out channels, in channels / groups, kernel sizes
    stride: tuple
    padding: tuple
    dilation: tuple
    transposed: bool
    output_padding: tuple        # zeros unless transposed
    groups: int
    dtype: str                   # "float32", "float16", "bfloat16"...
    layout: str                  # one of LAYOUTS
    benchmark: bool = False      # torch.backends.cudnn.benchmark
    deterministic: bool = False  # cudnn.deterministic or use_deterministic_algorithms
    tf32: bool = True            # cudnn.allow_tf32 (True for other dtypes than fp32)
    cudnn: bool = True           # torch.backends.cudnn.enabled

    def key(self) -> str:
        """The table's key: every field, in a fixed order, readable."""
        def dims(values):
            return "x".join(str(v) for v in values)

        def flag(value):
            return "1" if value else "0"

        return (f"{self.part} n={self.batch} in={dims(self.input)} w={dims(self.weight)} "
                f"stride={dims(self.stride)} pad={dims(self.padding)} "
                f"dil={dims(self.dilation)} groups={self.groups} "
                f"transposed={flag(self.transposed)} out_pad={dims(self.output_padding)} "
                f"dtype={self.dtype} layout={self.layout} "
                f"benchmark={flag(self.benchmark)} deterministic={flag(self.deterministic)} "
                f"tf32={flag(self.tf32)} cudnn={flag(self.cudnn)}")

    @classmethod
    def from_key(cls, key: str) -> "ConvSignature":
        tokens = key.split()
        if not tokens:
            raise ValueError("an empty key")
        fields: dict = {"part": tokens[0]}
        for token in tokens[1:]:
            name, sep, value = token.partition("=")
            if not sep or name not in _KEY_NAMES:
                raise ValueError(f"{token!r} is not a field of a signature")
            field = _KEY_NAMES[name]
            if field in _SHAPES:
                fields[field] = [int(v) for v in value.split("x")] if value else []
            elif field in _FLAGS:
                if value not in ("0", "1"):
                    raise ValueError(f"{token!r}: a flag is 0 or 1")
                fields[field] = value == "1"
            elif field in ("batch", "groups"):
                fields[field] = int(value)
            else:
                fields[field] = value
        signature = cls.from_fields(fields)
        if signature.key() != key:
            raise ValueError(f"not in the canonical form {signature.key()!r}")
        return signature

    @classmethod
    def from_fields(cls, fields: dict) -> "ConvSignature":
        """A signature from a mapping of its fields (a probe's record), checked and put in
        the canonical form (tf32 is True for dtypes it does not apply to)."""
        missing = [f for f in ("part", "batch", "input", "weight", "stride", "padding",
                               "dilation", "groups", "dtype", "layout") if f not in fields]
        if missing:
            raise ValueError(f"missing {', '.join(missing)}")
        part = fields["part"]
        if part not in PARTS:
            raise ValueError(f"part {part!r} is not one of {', '.join(PARTS)}")
        shapes = {}
        for name in _SHAPES:
            value = fields.get(name, [])
            if isinstance(value, (str, bytes)) or not all(
                    isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
                raise ValueError(f"{name} must be a list of non-negative ints, not {value!r}")
            shapes[name] = tuple(value)
        spatial = len(shapes["weight"]) - 2
        if spatial < 1 or len(shapes["input"]) != spatial + 1:
            raise ValueError(f"input {list(shapes['input'])} and weight "
                             f"{list(shapes['weight'])} do not make a convolution")
        if not all(shapes["input"]) or not all(shapes["weight"]):
            raise ValueError("input and weight sizes must be positive")
        transposed = fields.get("transposed", False)
        if transposed not in (0, 1):
            raise ValueError(f"transposed must be a bool, not {transposed!r}")
        transposed = bool(transposed)
        if not transposed:
            shapes["output_padding"] = (0,) * spatial
        for name in ("stride", "padding", "dilation", "output_padding"):
            if len(shapes[name]) != spatial:
                raise ValueError(f"{name} {list(shapes[name])} has not {spatial} dims")
        if not all(shapes["stride"]) or not all(shapes["dilation"]):
            raise ValueError("stride and dilation must be positive")
        for name in ("batch", "groups"):
            value = fields[name]
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, not {value!r}")
        dtype = fields["dtype"]
        if not isinstance(dtype, str) or not dtype.isidentifier():
            raise ValueError(f"dtype must be a name like 'float32', not {dtype!r}")
        if fields["layout"] not in LAYOUTS:
            raise ValueError(f"layout {fields['layout']!r} is not one of {', '.join(LAYOUTS)}")
        flags = {}
        for name, default in (("benchmark", False), ("deterministic", False),
                              ("tf32", True), ("cudnn", True)):
            value = fields.get(name, default)
            if value not in (0, 1):  # True, False, 0 and 1
                raise ValueError(f"{name} must be a bool, not {value!r}")
            flags[name] = bool(value)
        if dtype != "float32":
            flags["tf32"] = True  # TF32 applies to fp32 only: one key for either setting
        signature = cls(part=part, batch=fields["batch"], transposed=transposed,
                        groups=fields["groups"], dtype=dtype, layout=fields["layout"],
                        **shapes, **flags)
        if signature.activation_bytes() <= 0:
            raise ValueError("the convolution has an empty output")
        return signature

    def fields(self) -> dict:
        """The signature as a JSON-ready mapping (what a probe's record holds)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    def layer(self) -> "ConvSignature":
        """The same signature at no particular batch size."""
        return replace(self, batch=0)

    def depthwise(self) -> bool:
        """One group per input channel: cuDNN runs these with kernels of their own."""
        return self.groups > 1 and self.groups == self.input[0]

    def kind(self) -> tuple:
        """What a layer shares with the layers the table's nearest-layer lookup may take
        for it: everything but the batch, the channels and the pixels (a depthwise layer
        is a kind of its own whatever its channels)."""
        return (self.part, self.dtype, self.layout, self.benchmark, self.deterministic,
                self.tf32, self.cudnn, self.weight[2:], self.stride, self.padding,
                self.dilation, self.transposed, self.output_padding,
                "depthwise" if self.depthwise() else self.groups > 1)

    def position(self) -> tuple:
        """Where a layer sits among those of its kind: log in channels, out channels and
        pixels per sample."""
        return (math.log(self.input[0]), math.log(self.output()[0]),
                math.log(math.prod(self.input[1:])))

    def size_group(self) -> str:
        """The signatures the size rule gives one ratio: same part, dtype, layout, flags,
        and depthwise or not (cuDNN's depthwise kernels mostly take no workspace, where
        the others take about a byte per byte of input and output)."""
        key = self.key()
        return (f"{self.part} " + key[key.index(" dtype=") + 1:]
                + (" depthwise" if self.depthwise() else ""))

    def output(self) -> tuple:
        """One sample's output: channels, then the spatial sizes."""
        kernel = self.weight[2:]
        spatial = []
        for i, size in enumerate(self.input[1:]):
            s, p, d, k = self.stride[i], self.padding[i], self.dilation[i], kernel[i]
            if self.transposed:
                spatial.append((size - 1) * s - 2 * p + d * (k - 1)
                               + self.output_padding[i] + 1)
            else:
                spatial.append((size + 2 * p - d * (k - 1) - 1) // s + 1)
        channels = self.weight[1] * self.groups if self.transposed else self.weight[0]
        return (channels, *spatial)

    def activation_bytes(self) -> int:
        """Bytes of the batch's input and output: what the size rule scales."""
        out = self.output()
        if min(out) <= 0:
            return 0
        return self.batch * (math.prod(self.input) + math.prod(out)) * \
            _ITEMSIZE.get(self.dtype, 4)
