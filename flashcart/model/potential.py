"""The FlashCart potential: an ICT message-passing network predicting energies and forces.

Units: positions and cells in Å, energies in eV, forces in eV/Å, stress in eV/Å^3.
Architecture: ``docs/model.md``. All options are keys of ``configs/default.yaml``; the
Python constructor takes the same names with the same defaults (:data:`MODEL_KEYS`).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from ase.data import atomic_numbers, chemical_symbols

from ..cartesian import DirectionExpansion
from ..cartesian._frozen import frozen_derived
from ..cartesian._layout import edge_csr, edge_csr_reused
from ..nn.blocks import Gate, Interaction, ProductBlock
from ..nn.edge_features import edge_features
from ..nn.edge_layout import EdgeLayout
from ..nn.edge_pairs import EdgePairs, edge_pairs, pairs_fit
from ..nn.radial import MLP, ChebyshevBasis, PolynomialEnvelope
from ..nn.radial_table import cubic_table

__all__ = ["FlashCartPotential", "MODEL_KEYS", "element_types"]


def element_types(z_to_type: torch.Tensor, numbers: torch.Tensor, elements: list[str]) -> torch.Tensor:
    """Type indices ``[N]`` of atomic numbers ``[N]`` (on ``z_to_type``'s device); atomic numbers
    outside the periodic table and elements not in ``elements`` are errors naming them."""
    if bool((numbers < 1).any()) or bool((numbers >= z_to_type.shape[0]).any()):
        raise ValueError(f"atomic numbers must be in [1, {z_to_type.shape[0] - 1}], got {sorted(set(numbers.tolist()))}")
    types = z_to_type[numbers]
    if bool((types < 0).any()):
        bad = sorted({chemical_symbols[int(z)] for z in numbers[types < 0].tolist()})
        raise ValueError(f"elements {bad} are not among the model's elements {elements}")
    return types


# Configuration keys that define the architecture (saved with every checkpoint).
MODEL_KEYS = (
    "r_max",
    "r_min",
    "n_hidden_feats",
    "l_max_hidden_feats",
    "l_max_edge_attrs",
    "n_radial",
    "n_interactions",
    "correlation",
    "path_reduced_product",
    "nonlinearity",
    "gate_activation",
    "gate_bias",
    "layer_norm",
    "element_agnostic_interaction",
    "element_agnostic_product",
    "n_element_interaction_features",
    "radial_mapping",
    "cutoff_poly_order",
    "hidden_radial",
    "hidden_readout",
    "use_triton",
    "model_seed",
)


def _defaults() -> dict[str, Any]:
    from ..config import default_config

    cfg = default_config()
    return {k: cfg[k] for k in MODEL_KEYS}


class FlashCartPotential(torch.nn.Module):
    """Energy model ``E = sum_i (scale_Z * MLP(scalars_i) + shift_Z)``.

    Args:
        elements: chemical symbols the model knows (order defines type indices).
        **options: any of :data:`MODEL_KEYS`; missing ones take the packaged defaults.
        avg_neighbors: edges per atom within ``r_max`` (set by :meth:`prefit`).

    Attributes:
        radial_pairs: evaluate each element-agnostic radial MLP once per pair of reverse edges
            (:mod:`flashcart.nn.edge_pairs`; the same function, half the MLP's matrix products).
            ``"auto"`` (default): on the CPU and in compiled CUDA calls; ``True``: in eager CUDA
            calls too; ``False``: never. Not a configuration key: it changes the speed, not the
            results. Compiled calls read it when they are traced, and a change traces them again
            (one graph per setting). The tensor products read each pair's row for both edges
            (``WeightRows``: no gather, each row's gradient summed from its two edges without
            atomics). On the H200 (i2c3f20l2r, 1000-atom diamond, 2026-12-02) the MLPs with that
            sum took 0.72 ms against 1.07 ms per edge, a ``reduce-overhead`` force call 2.61 ms
            against 2.77 ms, peak memory 546 against 701 MiB. Eager CUDA calls keep one row per
            edge unless asked: they would pay the grouping's launches and a synchronisation per
            call to check that the list is pair-complete (compiled calls take it to be, and the
            :class:`~flashcart.model.predictor.Predictor` checks each new list once).
    """

    def __init__(self, elements: list[str], avg_neighbors: float = 1.0, **options: Any):
        super().__init__()
        unknown = set(options) - set(MODEL_KEYS)
        if unknown:
            raise ValueError(f"unknown model options: {sorted(unknown)}")
        for sym in elements:
            if sym not in atomic_numbers:
                raise ValueError(f"unknown chemical symbol {sym!r} in elements")
        opts = {**_defaults(), **options}
        self.options = opts
        self.elements = list(elements)
        self._radial_table_versions: tuple | None = None  # the radial MLPs' versions their tables were built from
        gen = torch.random.fork_rng()
        with gen:
            torch.manual_seed(opts["model_seed"])
            self._build(opts, avg_neighbors)

    def _build(self, o: dict[str, Any], avg_neighbors: float) -> None:
        n_el = len(self.elements)
        F, L, Le = o["n_hidden_feats"], o["l_max_hidden_feats"], o["l_max_edge_attrs"]
        backend = "auto" if o["use_triton"] else "torch"
        z_to_type = torch.full((len(chemical_symbols),), -1, dtype=torch.long)
        for t, sym in enumerate(self.elements):
            z_to_type[atomic_numbers[sym]] = t
        self.register_buffer("z_to_type", z_to_type)
        self.r_max = float(o["r_max"])
        self.expansion = DirectionExpansion(Le, backend=backend)
        self.basis = ChebyshevBasis(o["n_radial"], o["r_max"], o["r_min"], o["radial_mapping"])
        self.envelope = PolynomialEnvelope(o["r_max"], o["cutoff_poly_order"])
        self.embedding = torch.nn.Embedding(n_el, F)
        el_feats = None
        if not o["element_agnostic_interaction"]:
            el_feats = o["n_element_interaction_features"] or F
            self.element_embedding = torch.nn.Embedding(n_el, el_feats)
        self.interactions = torch.nn.ModuleList()
        self.gates = torch.nn.ModuleList()
        self.products = torch.nn.ModuleList()
        n_layers = o["n_interactions"]
        # with a product following, the interaction and gate carry the edge ranks 0..Le and the
        # product truncates to 0..L (parameters.md); without one they carry 0..L
        l_a = Le if o["correlation"] > 1 else L
        for k in range(n_layers):
            last = k == n_layers - 1
            l_in = 0 if k == 0 else L
            self.interactions.append(
                Interaction(l_in, l_a, Le, F, o["n_radial"], o["hidden_radial"], avg_neighbors, el_feats, o["layer_norm"], backend)
            )
            self.gates.append(Gate(l_a, F, o["gate_activation"], o["gate_bias"], backend) if o["nonlinearity"] else torch.nn.Identity())
            self.products.append(
                ProductBlock(
                    l_a,
                    0 if last else L,
                    F,
                    o["correlation"],
                    o["path_reduced_product"],
                    n_el,
                    o["element_agnostic_product"],
                    o["layer_norm"],
                    backend,
                )
            )
        self.readout = MLP(n_layers * F, o["hidden_readout"], 1, bias=False)
        self.register_buffer("atomic_shifts", torch.zeros(n_el, dtype=torch.float64))
        self.register_buffer("scale", torch.ones(n_el, dtype=torch.float64))
        self.register_buffer("avg_neighbors", torch.tensor(float(avg_neighbors), dtype=torch.float64))
        self.F = F
        self.radial_pairs: bool | str = "auto"

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_config(cls, cfg: dict[str, Any], elements: list[str] | None = None) -> "FlashCartPotential":
        """Build from a merged configuration (``elements`` overrides ``cfg['elements']``)."""
        elements = elements or cfg.get("elements")
        if not elements:
            raise ValueError("the model needs 'elements' (set it, or let training infer it from train_path)")
        return cls(list(elements), **{k: cfg[k] for k in MODEL_KEYS if k in cfg})

    def set_avg_neighbors(self, value: float) -> None:
        """Set the neighbour normalisation of every interaction."""
        self.avg_neighbors.fill_(value)
        for block in self.interactions:
            block.inv_sqrt_avg_neighbors.fill_(value**-0.5)

    def types_from_numbers(self, numbers: torch.Tensor) -> torch.Tensor:
        """Type indices of atomic numbers; raises naming any element the model does not know."""
        return element_types(self.z_to_type, numbers, self.elements)

    # ------------------------------------------------------------------ evaluation

    def site_energies(
        self,
        positions: torch.Tensor,
        types: torch.Tensor,
        cell: torch.Tensor,
        shifts: torch.Tensor,
        receivers: torch.Tensor,
        senders: torch.Tensor,
        edge_batch: torch.Tensor,
        layout: EdgeLayout | None = None,
    ) -> torch.Tensor:
        """Per-atom energies ``[N]`` (eV).

        Args:
            positions: ``[N, 3]`` Å; types: ``[N]``; cell: ``[G, 3, 3]`` Å (rows are lattice vectors);
            shifts: ``[E, 3]`` integer image offsets; receivers/senders: ``[E]`` (grouped by
            receiver); edge_batch: ``[E]`` graph of each edge; layout: the list's
            :class:`~flashcart.nn.edge_layout.EdgeLayout` from :meth:`edge_layout`, or ``None``
            to compute it in the call.
        """
        tables = self.radial_tables_used()
        edges = edge_features(
            positions,
            cell,
            shifts,
            receivers,
            senders,
            edge_batch,
            self.basis,
            self.envelope,
            self.expansion.eps,
            self.expansion.backend,
            need_length=tables,
        )
        attrs, radial, env = self.expansion.of_unit(edges.unit), edges.radial, edges.env
        if layout is None:
            csr = edge_csr_reused(receivers, senders, positions.shape[0])
            pairs = self._edge_pairs(receivers, senders, shifts, env, positions.shape[0])
        else:
            csr, pairs = (layout.rowptr, layout.perm, layout.srowptr), layout.pairs
        node_embed = self._embedded(self.element_embedding, types) if hasattr(self, "element_embedding") else None
        x = self._embedded(self.embedding, types)
        scalars = []
        for interaction, gate, product in zip(self.interactions, self.gates, self.products):
            a = interaction(x, attrs, radial, receivers, senders, csr, node_embed, pairs, edges.length)
            a = gate(a)
            x = product(a, types)
            scalars.append(x[:, : self.F])
        e = self.readout(torch.cat(scalars, dim=1)).squeeze(-1)
        scale, shift = self._site_affine(types, e.dtype)
        return e * scale + shift

    def _embedded(self, embedding: torch.nn.Embedding, types: torch.Tensor) -> torch.Tensor:
        """``embedding(types)``, looked up once per types tensor while the embedding is frozen (eager
        calls: a simulation's steps share one types tensor)."""
        return frozen_derived(embedding, "rows", [embedding.weight, types], lambda: embedding(types))

    def _site_affine(self, types: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Each atom's energy scale and shift ``[N]`` in ``dtype``: gathered once per types tensor
        in eager calls (the same tensor on every step of a simulation; two gathers and two copies
        otherwise), every time elsewhere (:func:`~flashcart.cartesian._frozen.frozen_derived`)."""
        sources = [types, self.scale, self.atomic_shifts]
        affine = frozen_derived(
            self, f"site_affine_{dtype}", sources, lambda: torch.stack([self.scale[types], self.atomic_shifts[types]]).to(dtype)
        )
        return affine[0], affine[1]

    def set_radial_tables(self, intervals: int | None) -> None:
        """Tabulate every interaction's radial MLP for inference, or drop the tables (``None`` or 0).

        Each interaction's path weights, a function of the edge length alone, become piecewise
        cubics on ``intervals`` equal intervals of ``[0, r_max]`` (:mod:`flashcart.nn.radial_table`:
        built in float64 from the current parameters, stored in the model's dtype and device as
        buffers that move with it and are not saved). Calls then read the tables instead of
        evaluating the MLPs. At 4096 intervals, float32 tables are closer to the float64 MLP
        than the float32 MLP is (``benchmarks/radial_table.py``).

        Inference only: a call in which a radial MLP's parameters require grad raises (the MLPs
        get no gradient through a table), and so does an eager call after the MLPs have changed
        (call this again). Element-agnostic interactions only (``element_agnostic_interaction``).
        Exported files (:mod:`flashcart.export`) evaluate the MLPs.
        """
        if not intervals:
            for interaction in self.interactions:
                interaction.set_radial_table(None, 0.0)
            self._radial_table_versions = None
            return
        if hasattr(self, "element_embedding"):
            raise ValueError(
                "radial tables need element-agnostic interactions (element_agnostic_interaction: true): "
                "these radial MLPs also read the elements of each edge"
            )
        for interaction in self.interactions:
            like = next(interaction.radial.parameters())
            mlp = copy.deepcopy(interaction.radial).to("cpu", torch.float64)
            table = cubic_table(lambda d, mlp=mlp: mlp(self.basis(d) * self.envelope(d)[:, None]), self.r_max, int(intervals))
            interaction.set_radial_table(table.to(device=like.device, dtype=like.dtype), self.r_max)
        self._radial_table_versions = self._radial_mlp_versions()

    def _radial_mlp_versions(self) -> tuple:
        """The radial MLPs' parameters' version counters: in-place changes (an optimiser step,
        ``load_state_dict``) advance them; moves and casts (``.to``) do not."""
        return tuple(p._version for interaction in self.interactions for p in interaction.radial.parameters())

    def __deepcopy__(self, memo):
        """A copy whose tables (if any) stay valid exactly when this model's are: a copy's
        parameters start new version counters."""
        new = self.__class__.__new__(self.__class__)
        memo[id(self)] = new
        new.__setstate__(copy.deepcopy(self.__dict__, memo))
        if self._radial_table_versions is not None:
            fresh = self._radial_mlp_versions() == self._radial_table_versions
            new._radial_table_versions = new._radial_mlp_versions() if fresh else ("stale",)
        return new

    def radial_tables_used(self) -> bool:
        """Whether calls read tabulated radial MLPs (:meth:`set_radial_tables`); raises when the
        MLPs have changed since the tables were built (checked in eager calls)."""
        versions = getattr(self, "_radial_table_versions", None)
        if versions is None:
            return False
        if not torch.compiler.is_compiling() and self._radial_mlp_versions() != versions:
            raise RuntimeError(
                "the radial MLPs changed after their tables were built: call set_radial_tables again, or set_radial_tables(None)"
            )
        return True

    def radial_pairs_used(self, cuda: bool, compiled: bool = False) -> bool:
        """Whether a call on CUDA tensors (or not), compiled with ``torch.compile`` (or eager),
        groups the edges into pairs for the radial MLPs (:attr:`radial_pairs`; element-agnostic
        interactions only). ``"auto"``: every CPU call and compiled CUDA calls."""
        mode = self.radial_pairs
        if mode not in (True, False, "auto"):
            raise ValueError(f"FlashCartPotential.radial_pairs must be True, False or 'auto', got {mode!r}")
        if mode is False or hasattr(self, "element_embedding"):
            return False
        return mode is True or not cuda or compiled

    def edge_layout(
        self, receivers, senders, shifts, n_real_edges: int, n_nodes: int, compiled: bool, where: str = "the neighbour list"
    ) -> EdgeLayout:
        """The :class:`~flashcart.nn.edge_layout.EdgeLayout` of a neighbour list, for calls of
        :meth:`forward` on it (:mod:`flashcart.nn.edge_layout`): the products' CSR layout, and the
        radial MLPs' pairs where a call would use them (:meth:`radial_pairs_used`).

        Args:
            receivers, senders: ``[E]`` (grouped by receiver); shifts: ``[E, 3]``; n_real_edges: the
                first edges that are real (those after them are padding, longer than the cutoff);
            n_nodes: the node count; compiled: for compiled calls, which cannot fall back to one MLP
                row per edge: a list that is not pair-complete is an error (``ValueError`` naming
                ``where``); eager calls then get no pairs.

        With pairs, one synchronisation (:func:`~flashcart.nn.edge_pairs.pairs_fit`).
        """
        rowptr, perm, srowptr = edge_csr(receivers, senders, n_nodes)
        pairs = None
        if receivers.shape[0] > 0 and self.radial_pairs_used(receivers.is_cuda, compiled=compiled):
            live = torch.arange(receivers.shape[0], device=receivers.device) < n_real_edges
            pairs = edge_pairs(receivers, senders, shifts, live, n_nodes)
            if not pairs_fit(pairs, shifts, n_nodes):
                if compiled:
                    raise ValueError(
                        f"{where} is not pair-complete ({int(pairs.n_groups)} pairs and single edges among {n_real_edges} edges, "
                        f"at most {pairs.leader.shape[0]} fit): compiled calls evaluate the radial MLPs once per pair of reverse "
                        f"edges, so every edge i -> j needs its j -> i with the opposite shift (a full neighbour list). "
                        f"Pass a full list, or set model.radial_pairs = False"
                    )
                pairs = None
        return EdgeLayout(rowptr, perm, srowptr, pairs)

    def _edge_pairs(self, receivers, senders, shifts, env, n_nodes: int) -> EdgePairs | None:
        """The edges grouped into reverse pairs for the radial MLPs, or ``None`` (one MLP row per edge).

        Used as :attr:`radial_pairs` says. Eager calls check that every group has a row
        (:func:`~flashcart.nn.edge_pairs.pairs_fit`, one synchronisation) and fall back to one row
        per edge when not; compiled calls and CUDA-graph captures cannot check, so they take the
        list to be pair-complete, as every list FlashCart builds is (the :class:`Predictor`
        passes each call its list's pairs, checked once per list: :meth:`edge_layout`). Traced and exported models keep one row per edge.
        """
        # Not torch.compiler.is_exporting(): it is also true while dynamo traces a CUDA call for
        # torch.compile (torch 2.11, H200, 2026-12-02), which then never used the pairs. Exported
        # files use frozen_copy, which turns the pairs off.
        if receivers.shape[0] == 0 or torch.jit.is_tracing():
            return None
        compiling = torch.compiler.is_compiling()
        if not self.radial_pairs_used(receivers.is_cuda, compiled=compiling):
            return None
        pairs = edge_pairs(receivers, senders, shifts, env != 0, n_nodes)
        if compiling or (receivers.is_cuda and torch.cuda.is_current_stream_capturing()):
            return pairs
        return pairs if pairs_fit(pairs, shifts, n_nodes) else None

    def forward(
        self, positions, types, cell, shifts, receivers, senders, batch, edge_batch, n_graphs: int, layout: EdgeLayout | None = None
    ):
        """Energies per graph ``[G]`` (eV); ``layout``: see :meth:`site_energies`."""
        site = self.site_energies(positions, types, cell, shifts, receivers, senders, edge_batch, layout)
        if n_graphs == 1:  # one structure (a simulation's call): a sum, whose backward broadcasts instead of gathering
            return site.sum(0, keepdim=True)
        return torch.zeros(n_graphs, dtype=site.dtype, device=site.device).index_add(0, batch, site)

    def predict(self, batch, forces: bool = True, stress: bool = False, create_graph: bool = False) -> dict[str, torch.Tensor]:
        """Energy ``[G]``, forces ``[N, 3]`` (``-dE/dx``) and stress ``[G, 3, 3]`` (``dE/d(strain) / V``).

        Eager and unpadded; the same evaluation as :class:`~flashcart.model.Predictor`. With
        ``create_graph`` the results stay differentiable (training on forces).
        """
        from .predictor import Predictor

        return Predictor(self)(batch, forces=forces, stress=stress, create_graph=create_graph)
