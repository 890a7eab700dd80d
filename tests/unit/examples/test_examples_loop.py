"""trainkit.loop, the training loop's pieces: one step over accumulated sub-batches,
epoch times across a resume, the warm-up step left out of throughput, the fixed
steps per epoch of a resumed shard, rank-0 checkpoints and the resume lookup."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.conftest_examples import EXAMPLES  # noqa: F401  (trainkit on sys.path)

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch


def _training(batches: int = 1):  # type: ignore[no-untyped-def]
    from trainkit.dist import Backend
    from trainkit.loop import Training

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return Training(backend=Backend(), model=model, train_model=model, optimizer=opt,
                    scaler=None, criterion=torch.nn.CrossEntropyLoss(),
                    memory_format=torch.contiguous_format, use_amp=False, cuda=False)


def test_step_accumulates_sub_batches_like_one_batch() -> None:
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(1))
    y = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    one, two = _training(), _training()
    sums1 = torch.zeros(3, dtype=torch.float64)
    sums2 = torch.zeros(3, dtype=torch.float64)
    _, sync = one.step(x, y, lr=0.5, n_chunks=1, sums=sums1)
    two.step(x, y, lr=0.5, n_chunks=2, sums=sums2)
    assert sync == 0.0 and one.optimizer.param_groups[0]["lr"] == 0.5
    # Two half-batches, each loss halved, give the mean gradient of the whole batch.
    for a, b in zip(one.model.parameters(), two.model.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)
    assert float(sums1[2]) == float(sums2[2]) == 8
    assert abs(float(sums1[0]) - float(sums2[0])) < 1e-4


def test_uint8_images_are_normalised_on_the_device_as_the_float_input() -> None:
    from trainkit.data import SyntheticImages, normalise

    def conv_training():  # type: ignore[no-untyped-def]
        from trainkit.dist import Backend
        from trainkit.loop import Training

        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.AdaptiveAvgPool2d(1),
                                    torch.nn.Flatten(), torch.nn.Linear(4, 3))
        return Training(backend=Backend(), model=model, train_model=model,
                        optimizer=torch.optim.SGD(model.parameters(), lr=0.1), scaler=None,
                        criterion=torch.nn.CrossEntropyLoss(),
                        memory_format=torch.contiguous_format, use_amp=False, cuda=False)

    data = SyntheticImages(8, 3, 16, seed=4)
    pixels = torch.stack([data[i][0] for i in range(8)])
    y = torch.tensor([data[i][1] for i in range(8)])
    as_bytes, as_floats = conv_training(), conv_training()
    sums = [torch.zeros(3, dtype=torch.float64) for _ in range(2)]
    as_bytes.step(pixels, y, lr=0.5, n_chunks=2, sums=sums[0])
    as_floats.step(normalise(pixels), y, lr=0.5, n_chunks=2, sums=sums[1])
    for a, b in zip(as_bytes.model.parameters(), as_floats.model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert torch.equal(sums[0], sums[1])
    loader = [(pixels, y)]
    assert as_bytes.evaluate(loader, 0, "val") == as_floats.evaluate(  # type: ignore[arg-type]
        [(normalise(pixels), y)], 0, "val")  # type: ignore[arg-type]


def test_evaluate_and_state_round_trip() -> None:
    from trainkit.loop import Progress

    t = _training()
    loader = [(torch.randn(5, 4), torch.tensor([0, 1, 2, 0, 1]))] * 3
    top1, top5, n = t.evaluate(loader, max_batches=2, name="val")  # type: ignore[arg-type]
    assert n == 10 and 0 <= top1 <= top5 == 1.0  # 3 classes: top-5 always hits
    progress = Progress(epoch=2, step_in_epoch=1, global_step=9, global_batch=16,
                        epoch_times=[1.5])
    state = t.state(progress, arch="x", num_classes=3)
    assert state["arch"] == "x" and state["scaler"] is None
    other = _training()
    with torch.no_grad():
        for p in other.model.parameters():
            p.add_(1.0)
    assert other.load_state(state) == progress
    assert all(torch.equal(a, b) for a, b in zip(t.model.parameters(),
                                                 other.model.parameters(), strict=True))


def test_epoch_times_add_up_across_a_resume() -> None:
    from trainkit.loop import Progress

    p = Progress()
    p.add_epoch_time(0, 1.23456)
    p.add_epoch_time(1, 2.0)
    p.add_epoch_time(1, 0.5)  # the resumed rest of epoch 2
    assert p.epoch_times == [1.2346, 2.5]


def test_timing_leaves_out_the_first_step() -> None:
    from trainkit.loop import Timing

    t = Timing()
    assert t.images_per_sec is None and t.timed_steps == 0
    t.add(100, 5.0, 1.0)  # warm-up: counted as a step, not timed
    assert (t.steps, t.images, t.seconds, t.sync) == (1, 0, 0.0, 0.0)
    t.add(100, 0.5, 0.25)
    assert t.steps == 2 and t.timed_steps == 1 and t.images == 100 and t.sync == 0.25
    assert t.seconds == 0.5 and t.images_per_sec == 200


def test_steps_per_epoch_stays_whole_while_a_resumed_epoch_skips() -> None:
    from trainkit.data import ResumableDistributedSampler, SyntheticImages
    from trainkit.loop import TrainData

    data = SyntheticImages(40, 4, 8, seed=0)
    sampler = ResumableDistributedSampler(data, num_replicas=2, rank=0, shuffle=True, seed=1,
                                          drop_last=True)
    td = TrainData(dataset=data, sampler=sampler, batch=4, workers=0, pin_memory=False)
    assert td.steps_per_epoch == 5
    batches = list(td.loader(epoch=1, step_in_epoch=3))
    assert len(batches) == 2 and td.steps_per_epoch == 5


def test_checkpoints_only_on_rank_zero_and_resume_lookup(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    from trainkit.loop import Checkpoints, Progress, find_resume_state

    t = _training()
    progress = Progress(global_step=7)
    Checkpoints(str(tmp_path / "r1"), keep=2, rank=1).save(t, progress)
    assert not (tmp_path / "r1").exists()
    off = Checkpoints("", keep=2, rank=0)
    off.save(t, progress)
    assert off.last is None
    ck = Checkpoints(str(tmp_path / "ck"), keep=2, rank=0, meta={"arch": "lin"})
    ck.save(t, progress)
    assert ck.last == str(tmp_path / "ck" / "checkpoint-00000007.pt")
    path, state = find_resume_state("latest", str(tmp_path / "ck")) or (None, {})
    assert path == Path(ck.last) and state["arch"] == "lin"
    assert state["progress"]["global_step"] == 7
    (tmp_path / "ck" / "checkpoint-00000009.pt").write_bytes(b"torn")
    path, _ = find_resume_state("latest", str(tmp_path / "ck")) or (None, {})
    assert path == Path(ck.last)
    assert "resume: skipping damaged checkpoint checkpoint-00000009.pt" in capsys.readouterr().out
    assert find_resume_state("latest", str(tmp_path / "empty")) is None
    assert "resume: no checkpoint in" in capsys.readouterr().out
    path, state = find_resume_state(ck.last, "") or (None, {})
    assert path == Path(ck.last) and state["arch"] == "lin"


def test_default_workers_follow_slurm_else_a_share_of_the_cores_up_to_8(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import resnet50_imagenet as ex

    assert ex.default_workers({"SLURM_CPUS_PER_TASK": "12"}, 1, gpu=True) == 11
    assert ex.default_workers({}, 1, gpu=False) == 0  # CPU runs: none
    monkeypatch.setattr(ex.os, "cpu_count", lambda: 16)
    assert ex.default_workers({}, 1, gpu=True) == 8
    assert ex.default_workers({}, 4, gpu=True) == 3


def test_a_resume_gives_every_rank_the_checkpoints_loss_scale(tmp_path: Path) -> None:
    """AMP's GradScaler state is rank 0's to load and every rank's to use: a rank left at
    the fresh scale scales its gradients differently from rank 0, and the averaged
    gradients, unscaled by each rank's own scale, differ between ranks (the weights
    drift apart). The scaler is CUDA's in the example; the CPU's runs the same logic."""
    import argparse

    import resnet50_imagenet as ex
    from trainkit.dist import Backend
    from trainkit.loop import Checkpoints, Progress

    sent: list = []

    class Rank(Backend):
        """One of two ranks, in this process: what rank 0 broadcasts, rank 1 receives."""

        def __init__(self, rank: int) -> None:
            super().__init__()
            self.rank, self.size = rank, 2

        def broadcast_state(self, model, optimizer, extra):  # type: ignore[no-untyped-def]
            if self.rank == 0:
                sent.append(extra)
            return sent[-1]

    def training(rank: int, init_scale: float = 2.0**16):  # type: ignore[no-untyped-def]
        t = _training()
        t.backend = Rank(rank)
        t.scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=1)
        return t

    first = training(0, init_scale=512.0)
    x, y = torch.randn(6, 4, generator=torch.Generator().manual_seed(2)), torch.tensor([0, 1, 2] * 2)
    first.step(x, y, lr=0.1, n_chunks=1, sums=torch.zeros(3, dtype=torch.float64))
    assert first.scaler.get_scale() == 1024.0  # grown after a clean step: not the initial scale
    Checkpoints(str(tmp_path), keep=2, rank=0, meta={"arch": "resnet18", "num_classes": 3}).save(
        first, Progress(global_step=1, global_batch=12))
    args = argparse.Namespace(resume="latest", checkpoint_dir=str(tmp_path), arch="resnet18")
    ranks = [training(0), training(1)]
    for t in ranks:  # rank 0 loads and broadcasts first, as in a real job
        progress, resumed_from = ex.resume(args, t, num_classes=3, global_batch=12)
        assert progress.global_step == 1 and resumed_from
    assert [t.scaler.state_dict() for t in ranks] == [first.scaler.state_dict()] * 2
