"""The examples' ResNets match torchvision's state_dict layout (golden key/shape lists)."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

GOLDEN = Path(__file__).parent / "golden_examples"
# Published parameter counts of torchvision.models.resnet18() / resnet50().
TORCHVISION_PARAMS = {"resnet18": 11_689_512, "resnet50": 25_557_032}


def _golden(arch: str) -> list[tuple[str, tuple[int, ...]]]:
    rows = []
    for line in (GOLDEN / f"torchvision_{arch}_state_dict.txt").read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        key, shape = line.split(" ", 1)
        rows.append(
            (key, tuple(int(d) for d in shape.strip("()").replace(" ", "").split(",") if d))
        )
    return rows


@pytest.mark.parametrize("arch", ["resnet18", "resnet50"])
def test_state_dict_keys_and_shapes_match_torchvision(arch: str) -> None:
    from trainkit.resnet import build_model

    model = build_model(arch)
    got = [(k, tuple(v.shape)) for k, v in model.state_dict().items()]
    assert got == _golden(arch)
    assert sum(p.numel() for p in model.parameters()) == TORCHVISION_PARAMS[arch]


def test_golden_lists_hold_torchvision_landmarks() -> None:
    # Independent of the model code: what torchvision's ResNet-50 is known to contain.
    rows = dict(_golden("resnet50"))
    assert len(rows) == 320
    assert rows["conv1.weight"] == (64, 3, 7, 7)
    assert rows["layer1.0.downsample.0.weight"] == (256, 64, 1, 1)
    assert rows["layer4.2.conv3.weight"] == (2048, 512, 1, 1)
    assert rows["fc.weight"] == (1000, 2048)
    r18 = dict(_golden("resnet18"))
    assert len(r18) == 122
    assert "layer1.0.downsample.0.weight" not in r18
    assert r18["layer2.0.downsample.1.running_var"] == (128,)
    assert r18["fc.weight"] == (1000, 512)


@pytest.mark.parametrize("arch", ["resnet18", "resnet50"])
def test_forward_small_images_and_state_dict_round_trip(arch: str) -> None:
    from trainkit.resnet import build_model

    torch.manual_seed(0)
    a = build_model(arch, num_classes=7).eval()
    b = build_model(arch, num_classes=7).eval()
    b.load_state_dict(a.state_dict(), strict=True)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert a(x).shape == (2, 7)
        assert torch.equal(a(x), b(x))


def test_bottleneck_has_stride_on_3x3_conv() -> None:
    # ResNet v1.5 as torchvision builds it: the stride sits on conv2, not conv1.
    from trainkit.resnet import resnet50

    block = resnet50().layer2[0]
    assert block.conv1.stride == (1, 1)
    assert block.conv2.stride == (2, 2)
    assert block.downsample[0].stride == (2, 2)


def test_unknown_arch() -> None:
    from trainkit.resnet import build_model

    with pytest.raises(KeyError, match="resnet18"):
        build_model("vgg16")
