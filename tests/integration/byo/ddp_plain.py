"""A plain torchrun-style DDP script (gloo on CPU): it reads only torchrun's variables
and imports nothing from hpcdl. hpcdl must run it unchanged under srun or torchrun.
Its line goes out in one write: mpirun forwards the ranks' output unlabelled, and
print() (two writes when unbuffered) lets another rank's line land in between."""

import os
import socket
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")  # env://: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = torch.nn.Linear(8, 2)
ddp = torch.nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
data = torch.Generator().manual_seed(1000 + rank)  # each rank its own batch
for _ in range(3):
    x = torch.randn(16, 8, generator=data)
    loss = ddp(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
params = ",".join(f"{v:.6f}" for v in torch.cat([p.detach().flatten() for p in model.parameters()]))
env = os.environ
sys.stdout.write(f"PLAIN host={socket.gethostname()} rank={rank} world={world} local_rank={env['LOCAL_RANK']} "
                 f"local_world_size={env['LOCAL_WORLD_SIZE']} node_rank={env.get('NODE_RANK', '-')} "
                 f"group_rank={env['GROUP_RANK']} master={env['MASTER_ADDR']}:{env['MASTER_PORT']} "
                 f"cuda_visible={env.get('CUDA_VISIBLE_DEVICES', '-')} params={params}\n")
sys.stdout.flush()
# Leave together, then skip torch's C++ teardown: under host mpirun on the sandbox's
# network a rank sometimes aborted there after its work was done ("terminate called
# without an active exception"), with or without destroy_process_group.
dist.barrier()
os._exit(0)
