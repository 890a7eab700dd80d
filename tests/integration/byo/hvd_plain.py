"""A plain Horovod script (hvd.init() under srun --mpi=pmix), as the seed tutorials
write them; it imports nothing from hpcdl. Same model, data and steps as ddp_plain.py
(and its line goes out in one write too)."""

import os
import socket
import sys

import horovod.torch as hvd
import torch

hvd.init()
rank, world = hvd.rank(), hvd.size()
torch.manual_seed(0)
model = torch.nn.Linear(8, 2)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
data = torch.Generator().manual_seed(1000 + rank)
for _ in range(3):
    x = torch.randn(16, 8, generator=data)
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
params = ",".join(f"{v:.6f}" for v in torch.cat([p.detach().flatten() for p in model.parameters()]))
env = os.environ
sys.stdout.write(f"PLAIN host={socket.gethostname()} rank={rank} world={world} local_rank={hvd.local_rank()} "
                 f"local_world_size={hvd.local_size()} node_rank={env.get('NODE_RANK', '-')} "
                 f"group_rank={env.get('GROUP_RANK', '-')} master={env.get('MASTER_ADDR')}:{env.get('MASTER_PORT')} "
                 f"cuda_visible={env.get('CUDA_VISIBLE_DEVICES', '-')} params={params}\n")
sys.stdout.flush()
