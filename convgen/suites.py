"""Built-in layer suites: the shapes `convgen emit`, `convgen bench` and the tests use
when the user gives none.  Plain data; each layer is a :class:`ConvProblem`.

Two kinds of suite live here.  The three the project was tuned on (``TUNED_ON``: the CIFAR
pair and ResNet-50) carry hand-made tuning-database entries; the others are transcribed
from the networks' papers and reference implementations at the batch sizes people train
them with, and nobody tuned for them, so they say how the planner's rules carry over to
shapes it was not fitted to.  Each suite names its source.
"""

from __future__ import annotations

from dataclasses import dataclass

from .ir import ConvProblem, PairLike


@dataclass(frozen=True)
class Layer:
    name: str
    problem: ConvProblem


@dataclass(frozen=True)
class Suite:
    name: str
    source: str  # where the shapes come from: paper, table, reference implementation
    layers: tuple[Layer, ...]


def _layer(name: str, n: int, hw: int, c: int, k: int, f: int = 3, stride: int = 1, pad: int | None = None) -> Layer:
    return Layer(name, ConvProblem(hw, hw, c, k, f, f, stride, f // 2 if pad is None else pad, 1, n=n))


def _rect(name: str, n: int, h: int, w: int, c: int, k: int, r: int, s: int,
          stride: PairLike, pad: PairLike) -> Layer:
    return Layer(name, ConvProblem(h, w, c, k, r, s, stride, pad, 1, n=n))


def _depthwise(prefix: str, n: int, f: int, layers: tuple[tuple[int, int, int], ...],
               suffix: str = "") -> tuple[Layer, ...]:
    """Depthwise f x f layers (groups = C = K, padding f // 2) given as (input size, C, stride);
    named by their channel count and input size, the stride where it is not 1, and ``suffix``."""
    return tuple(Layer(f"{prefix}{c}-{hw}px" + (f"-s{st}" if st > 1 else "") + suffix,
                       ConvProblem(hw, hw, c, c, f, f, st, f // 2, 1, c, n=n))
                 for hw, c, st in layers)


def _pointwise(prefix: str, n: int, pairs: tuple[tuple[int, int, int], ...]) -> tuple[Layer, ...]:
    """1x1 layers given as (spatial size, C, K); named by their channel counts."""
    return tuple(_layer(f"{prefix}{hw}-{c}to{k}", n, hw, c, k, f=1) for hw, c, k in pairs)


_SUITES: tuple[Suite, ...] = (
    Suite("cifar-resnet", "ResNet-20 for CIFAR-10 (He et al. 2015, section 4.2), batch 256", (
        _layer("conv1", 256, 32, 3, 16),
        _layer("res1", 256, 32, 16, 16),
        _layer("res2-down", 256, 32, 16, 32, stride=2),
        _layer("res2", 256, 16, 32, 32),
        _layer("res3-down", 256, 16, 32, 64, stride=2),
        _layer("res3", 256, 8, 64, 64),
        _layer("shortcut", 256, 32, 16, 32, f=1, stride=2, pad=0),
    )),
    Suite("cifar-vgg", "a small VGG-style CIFAR-10 network (examples/train_step.py), batch 256", (
        _layer("conv1", 256, 32, 3, 32),
        _layer("conv2", 256, 16, 32, 64),
        _layer("conv3", 256, 8, 64, 128),
        _layer("conv32", 256, 32, 32, 32),
    )),
    Suite("resnet50", "ResNet-50 v1.5 at 224x224 (torchvision resnet50), batch 64", (
        _layer("conv1", 64, 224, 3, 64, f=7, stride=2, pad=3),
        _layer("l1-1x1a", 64, 56, 64, 64, f=1),
        _layer("l1-3x3", 64, 56, 64, 64),
        _layer("l1-1x1b", 64, 56, 64, 256, f=1),
        _layer("l1-1x1c", 64, 56, 256, 64, f=1),
        _layer("l2-3x3-down", 64, 56, 128, 128, stride=2),
        _layer("l2-3x3", 64, 28, 128, 128),
        _layer("l2-1x1", 64, 28, 128, 512, f=1),
        _layer("l3-3x3", 64, 14, 256, 256),
        _layer("l3-1x1", 64, 14, 1024, 256, f=1),
        _layer("l4-3x3", 64, 7, 512, 512),
        _layer("l4-1x1", 64, 7, 512, 2048, f=1),
    )),
    # ResNet-18 and ResNet-34 share every distinct layer shape (34 only repeats blocks).
    Suite("resnet18", "ResNet-18/34 at 224x224 (He et al. 2015, Table 1; torchvision resnet18/34), batch 128", (
        _layer("conv1", 128, 224, 3, 64, f=7, stride=2, pad=3),
        _layer("l1-3x3", 128, 56, 64, 64),
        _layer("l2-3x3-down", 128, 56, 64, 128, stride=2),
        _layer("l2-3x3", 128, 28, 128, 128),
        _layer("l2-proj", 128, 56, 64, 128, f=1, stride=2, pad=0),
        _layer("l3-3x3-down", 128, 28, 128, 256, stride=2),
        _layer("l3-3x3", 128, 14, 256, 256),
        _layer("l3-proj", 128, 28, 128, 256, f=1, stride=2, pad=0),
        _layer("l4-3x3-down", 128, 14, 256, 512, stride=2),
        _layer("l4-3x3", 128, 7, 512, 512),
        _layer("l4-proj", 128, 14, 256, 512, f=1, stride=2, pad=0),
    )),
    Suite("vgg16", "VGG-16, configuration D at 224x224 (Simonyan & Zisserman 2014, Table 1), batch 32", (
        _layer("conv1_1", 32, 224, 3, 64),
        _layer("conv1_2", 32, 224, 64, 64),
        _layer("conv2_1", 32, 112, 64, 128),
        _layer("conv2_2", 32, 112, 128, 128),
        _layer("conv3_1", 32, 56, 128, 256),
        _layer("conv3_2", 32, 56, 256, 256),
        _layer("conv4_1", 32, 28, 256, 512),
        _layer("conv4_2", 32, 28, 512, 512),
        _layer("conv5", 32, 14, 512, 512),
    )),
    # Base width 32; the decoder's inputs are the upsampled map concatenated with the skip
    # (64 + 32 = 96, 128 + 64 = 192, 256 + 128 = 384 channels); one foreground class.
    Suite("unet", "a 4-level UNet at 256x256 with base width 32 (Ronneberger et al. 2015, "
                  "same-padded as in common PyTorch ports), batch 16", (
        _layer("enc1a", 16, 256, 3, 32),
        _layer("enc1b", 16, 256, 32, 32),
        _layer("enc2a", 16, 128, 32, 64),
        _layer("enc2b", 16, 128, 64, 64),
        _layer("enc3a", 16, 64, 64, 128),
        _layer("enc3b", 16, 64, 128, 128),
        _layer("bottleneck", 16, 32, 128, 256),
        _layer("dec3-cat384", 16, 64, 384, 128),
        _layer("dec2-cat192", 16, 128, 192, 64),
        _layer("dec1-cat96", 16, 256, 96, 32),
        _layer("head", 16, 256, 32, 1, f=1),
    )),
    Suite("darknet53-down", "Darknet-53's stride-2 3x3 downsampling stack at 256x256 "
                            "(Redmon & Farhadi 2018, YOLOv3, Table 1), batch 64", (
        _layer("stem", 64, 256, 3, 32),
        _layer("down1", 64, 256, 32, 64, stride=2),
        _layer("down2", 64, 128, 64, 128, stride=2),
        _layer("down3", 64, 64, 128, 256, stride=2),
        _layer("down4", 64, 32, 256, 512, stride=2),
        _layer("down5", 64, 16, 512, 1024, stride=2),
    )),
    Suite("mobilenetv2-pw", "MobileNetV2's pointwise expand/project layers at 224x224 "
                            "(Sandler et al. 2018, Table 2; expansion 6), batch 128",
          _pointwise("pw", 128, (
              (112, 32, 16), (112, 16, 96), (56, 96, 24), (56, 24, 144), (56, 144, 24), (28, 144, 32),
              (28, 32, 192), (28, 192, 32), (14, 192, 64), (14, 64, 384), (14, 384, 96), (14, 96, 576),
              (7, 576, 160), (7, 160, 960), (7, 960, 320), (7, 320, 1280),
          ))),
    Suite("efficientnet-b0-pw", "EfficientNet-B0's pointwise expand/project layers at 224x224 "
                                "(Tan & Le 2019, Table 1; expansion 6), batch 128",
          _pointwise("pw", 128, (
              (28, 40, 240), (28, 240, 40), (14, 240, 80), (14, 80, 480), (14, 480, 80), (14, 480, 112),
              (14, 112, 672), (14, 672, 112), (7, 672, 192), (7, 192, 1152), (7, 1152, 192),
              (7, 1152, 320),
          ))),
    # Every inverted-residual block's depthwise 3x3 (multiplier 1) at 224x224: block (t, c, n, s)
    # rows of Table 2 after the stride-2 stem (112x112x32); the first block of each row has the
    # stride.  Repeated shapes once each (the 384@14 s1 layer serves both the 64- and 96-channel
    # rows, 960@7 s1 both the 160- and 320-channel ones).
    Suite("mobilenetv2-dw", "MobileNetV2's depthwise 3x3 layers at 224x224 (Sandler et al. 2018, Table 2; "
                            "torchvision mobilenet_v2), groups = C, batch 128",
          _depthwise("dw", 128, 3, (
              (112, 32, 1), (112, 96, 2), (56, 144, 1), (56, 144, 2), (28, 192, 1), (28, 192, 2),
              (14, 384, 1), (14, 576, 1), (14, 576, 2), (7, 960, 1),
          ))),
    # The 4x4 stride-4 stem takes 224 to 56 and 2x2 stride-2 convs downsample between stages; every
    # block opens with a 7x7 depthwise conv, padding 3, at its stage's width (depths 3, 3, 9, 3;
    # widths 96, 192, 384, 768).
    Suite("convnext-dw", "ConvNeXt-T's depthwise 7x7 layers, padding 3, at 224x224 (Liu et al. 2022, "
                         "'A ConvNet for the 2020s'; torchvision convnext_tiny), groups = C, batch 64",
          _depthwise("dw", 64, 7, ((56, 96, 1), (28, 192, 1), (14, 384, 1), (7, 768, 1)))),
    # Table 1's MBConv stages after the stride-2 stem, expansion 6: each block's depthwise conv at
    # the expanded width (6 x its input channels), 5x5 in stages 4, 6 and 7 and 3x3 in 5 and 8, the
    # stage's first block with the stride.  Only the shapes MobileNetV2's suite does not already
    # hold (stages 2 and 3 are its dw32-112px, dw96-112px-s2 and dw144-56px).
    Suite("efficientnet-b0-dw", "EfficientNet-B0's depthwise 5x5 and 3x3 layers at 224x224 (Tan & Le 2019, "
                                "Table 1; expansion 6; torchvision efficientnet_b0), groups = C, batch 128",
          _depthwise("dw", 128, 5, ((56, 144, 2), (28, 240, 1), (14, 480, 1), (14, 672, 1), (14, 672, 2),
                                    (7, 1152, 1)), suffix="-5x5")
          + _depthwise("dw", 128, 3, ((28, 240, 2), (14, 480, 1), (7, 1152, 1)))),
    # Each bottleneck's middle conv is a 3x3 grouped one, 32 groups, 4 channels a group at the first
    # stage's width (128), doubling with the width each stage; a stage's first block has the stride.
    Suite("resnext50-grouped", "ResNeXt-50 (32x4d)'s grouped 3x3 layers at 224x224 (Xie et al. 2017, Table 1; "
                               "torchvision resnext50_32x4d), groups 32, batch 64",
          tuple(Layer(f"g32-{c}-{hw}px" + ("-s2" if st > 1 else ""), ConvProblem(hw, hw, c, c, 3, 3, st, 1, 1, 32, n=64))
                for hw, c, st in ((56, 128, 1), (56, 256, 2), (28, 256, 1), (28, 512, 2), (14, 512, 1), (14, 1024, 2),
                                  (7, 1024, 1)))),
    Suite("large", "compute-bound 3x3 layers for the Hopper main loop: VGG-16's (configuration D) "
                   "widest layers at batch 64, and 256-channel layers at batch 512 and 1024", (
        _layer("vgg-conv2_2", 64, 112, 128, 128),
        _layer("vgg-conv3_2", 64, 56, 256, 256),
        _layer("vgg-conv4_2", 64, 28, 512, 512),
        _layer("vgg-conv5", 64, 14, 512, 512),
        _layer("c256-14px", 512, 14, 256, 256),
        _layer("c256-7px", 1024, 7, 256, 256),
        _layer("c64to256-15px", 1024, 15, 64, 256),
    )),
    Suite("speech", "spectrogram front ends: DeepSpeech2's two conv layers (Amodei et al. 2015, "
                    "161 frequency bins x 700 frames) and a 5x20 stride-2 layer, batch 32", (
        _rect("ds2-conv1", 32, 161, 700, 1, 32, 41, 11, (2, 2), (20, 5)),
        _rect("ds2-conv2", 32, 81, 350, 32, 32, 21, 11, (2, 1), (10, 5)),
        _rect("spec-5x20", 32, 161, 700, 1, 32, 5, 20, (2, 2), (2, 9)),
    )),
)

SUITE_INFO: dict[str, Suite] = {s.name: s for s in _SUITES}
SUITES: dict[str, tuple[Layer, ...]] = {s.name: s.layers for s in _SUITES}
# The suites with hand-made tuning-database entries; the rest measure how the rules generalise.
TUNED_ON: tuple[str, ...] = ("cifar-resnet", "cifar-vgg", "resnet50")


def get_suite(name: str) -> tuple[Layer, ...]:
    try:
        return SUITES[name]
    except KeyError:
        raise ValueError(f"unknown suite {name!r}; built-in suites: {', '.join(SUITES)}") from None
