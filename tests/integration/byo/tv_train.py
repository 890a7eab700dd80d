"""A user's own training script, written the way the frameworks' examples are
(PyTorch's examples/imagenet/main.py, Horovod's examples/pytorch/pytorch_imagenet_resnet50.py):
torchvision's resnet50, ImageFolder and transforms, a DistributedSampler, tqdm progress
and TensorBoard logs from rank 0 under ./logs. It imports nothing from hpcdl and reads
only what the launchers give: Horovod's own rank (--dist horovod) or torch.distributed's
env:// variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_RANK; --dist ddp).

    python3 train.py --data /path/to/imagenet --dist horovod
"""

import argparse
import os
import socket
import sys

import torch
import torch.nn.functional as F
import torch.utils.data
import torch.utils.data.distributed
from torch.utils.tensorboard import SummaryWriter
from torchvision import datasets, models, transforms
from tqdm import tqdm

parser = argparse.ArgumentParser(description="ResNet-50 on an ImageFolder dataset")
parser.add_argument("--data", required=True, help="dataset root with train/ and val/")
parser.add_argument("--dist", choices=["horovod", "ddp"], default="horovod")
parser.add_argument("--log-dir", default="./logs", help="TensorBoard log directory")
parser.add_argument("--epochs", type=int, default=90)
parser.add_argument("--batch-size", type=int, default=32, help="per rank")
parser.add_argument("--image-size", type=int, default=224)
parser.add_argument("--lr", type=float, default=0.0125, help="per rank")
parser.add_argument("--workers", type=int, default=4)
parser.add_argument("--max-steps", type=int, default=0, help="stop an epoch early (0: all)")
args = parser.parse_args()

cuda = torch.cuda.is_available()
if args.dist == "horovod":
    import horovod.torch as hvd

    hvd.init()
    rank, size, local_rank = hvd.rank(), hvd.size(), hvd.local_rank()
else:
    import torch.distributed as dist

    dist.init_process_group("nccl" if cuda else "gloo", init_method="env://")
    rank, size = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
if cuda:
    torch.cuda.set_device(local_rank)
device = torch.device("cuda" if cuda else "cpu")
torch.manual_seed(42)

normalize = transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
train_dataset = datasets.ImageFolder(
    os.path.join(args.data, "train"),
    transforms.Compose([transforms.RandomResizedCrop(args.image_size),
                        transforms.RandomHorizontalFlip(), transforms.ToTensor(), normalize]))
train_sampler = torch.utils.data.distributed.DistributedSampler(
    train_dataset, num_replicas=size, rank=rank)
train_loader = torch.utils.data.DataLoader(
    train_dataset, batch_size=args.batch_size, sampler=train_sampler,
    num_workers=args.workers, pin_memory=cuda)

model = models.resnet50(num_classes=len(train_dataset.classes)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * size, momentum=0.9)
if args.dist == "horovod":
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    net = model
else:
    net = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank] if cuda else None)

# Only rank 0 logs and shows progress, as in the examples.
log_writer = SummaryWriter(args.log_dir) if rank == 0 else None
step = 0
for epoch in range(args.epochs):
    net.train()
    train_sampler.set_epoch(epoch)
    steps = min(len(train_loader), args.max_steps or len(train_loader))
    with tqdm(total=steps, desc=f"Train Epoch #{epoch + 1}", disable=rank != 0) as t:
        for batch_idx, (data, target) in enumerate(train_loader):
            if batch_idx == steps:
                break
            data, target = data.to(device), target.to(device)
            optimizer.zero_grad()
            output = net(data)
            loss = F.cross_entropy(output, target)
            loss.backward()
            optimizer.step()
            acc = output.argmax(1).eq(target).float().mean()
            t.set_postfix({"loss": f"{loss.item():.4f}", "accuracy": f"{100.0 * acc.item():.2f}%"})
            t.update(1)
            if log_writer:
                log_writer.add_scalar("train/loss", loss.item(), step)
                log_writer.add_scalar("train/accuracy", acc.item(), step)
            step += 1
if log_writer:
    log_writer.flush()
    log_writer.close()

# Every rank must end with the same weights: compare a checksum across ranks.
checksum = torch.tensor([sum(float(p.detach().double().sum()) for p in model.parameters())],
                        dtype=torch.float64)
if args.dist == "horovod":
    sums = hvd.allgather(checksum).tolist()
else:
    gathered = [torch.zeros_like(checksum) for _ in range(size)]
    dist.all_gather(gathered, checksum)
    sums = [float(g) for g in gathered]
sys.stdout.write(f"TVTRAIN rank={rank} size={size} host={socket.gethostname()} "
                 f"steps={step} checksum={checksum.item():.6f}\n")
if rank == 0:
    agree = max(sums) - min(sums) <= 1e-6 * max(1.0, abs(sums[0]))
    sys.stdout.write(f"TVTRAIN_DONE dist={args.dist} size={size} agree={agree} "
                     f"cwd={os.getcwd()} log_dir={os.path.abspath(args.log_dir)}\n")
sys.stdout.flush()
if args.dist == "ddp":
    dist.barrier()
    dist.destroy_process_group()
