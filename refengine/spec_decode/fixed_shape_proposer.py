"""What EAGLE/EAGLE3/MTP and DFlash share past their eager pass over the committed rows: a proposal
of one row per request whose shapes depend on the batch size alone (`draft`), run eagerly or replayed
from its CUDA graph once the engine has captured one (draft_cuda_graphs.py)."""

import torch

from refengine.spec_decode.draft_cuda_graphs import DraftCudaGraphs, ProposalInputs
from refengine.spec_decode.network_proposer import NetworkProposer


class FixedShapeProposer(NetworkProposer):
    reads_hidden: bool  # whether `draft` reads ProposalInputs.hidden
    # Set once the engine captures the proposal's graphs; until then every proposal runs eagerly.
    cuda_graphs: DraftCudaGraphs | None = None
    # Proposals replayed from a graph and run eagerly: a test proves which path ran.
    num_graph_steps = 0
    num_eager_steps = 0

    def draft(self, inputs: ProposalInputs) -> torch.Tensor:
        """[B, k] draft ids from device inputs, with tensor ops only (no host read), so that a CUDA
        graph can capture it; a request's drafts past its num_drafts are not used."""
        raise NotImplementedError

    def capture_cuda_graphs(self, batch_sizes: list[int], max_blocks_per_seq: int, device: torch.device) -> None:
        """Capture `draft` for each padded batch size; from now on a proposal that fits one replays it."""
        dtype = next(self.network.parameters()).dtype
        graphs = DraftCudaGraphs(
            self.draft,
            hidden=(self.network.config.hidden_size, dtype) if self.reads_hidden else None,
            max_blocks_per_seq=max_blocks_per_seq,
            batch_sizes=batch_sizes,
            device=device,
        )
        graphs.capture()
        self.cuda_graphs = graphs

    def _run_draft(self, inputs: ProposalInputs, device: torch.device) -> torch.Tensor:
        if self.cuda_graphs is not None and self.cuda_graphs.can_run(inputs):
            self.num_graph_steps += 1
            return self.cuda_graphs.run(inputs)
        self.num_eager_steps += 1
        return self.draft(inputs.to(device))
