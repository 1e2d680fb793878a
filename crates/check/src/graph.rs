//! The dependency graph between transactions and the search for cycles in it.
//!
//! Nodes are transaction numbers; edges carry their kind (write-write, write-read, read-write,
//! real-time) and the key that caused them. Strongly connected components are found with an
//! iterative Tarjan; within each component, breadth-first searches restricted to edge kinds
//! find the smallest cycle of each Adya class, most severe first: G0 (write cycles), G1c
//! (write and read dependencies), G-single (exactly one anti-dependency), G2 (more), and the
//! `-realtime` variants that need real-time edges (violations of strict serializability only).

use std::collections::VecDeque;

/// Breadth-first searches started per component and class; bounds the search on huge
/// components (each start costs a pass over the component).
pub const CYCLE_SEARCH_STARTS_MAX: usize = 64;

/// What an edge means.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum EdgeKind {
    /// The source installed the version the target overwrote.
    Ww,
    /// The target read what the source wrote.
    Wr,
    /// The source read a version the target overwrote (anti-dependency).
    Rw,
    /// The source completed before the target was invoked.
    Realtime,
}

impl EdgeKind {
    fn bit(self) -> u8 {
        match self {
            Self::Ww => 1,
            Self::Wr => 2,
            Self::Rw => 4,
            Self::Realtime => 8,
        }
    }

    /// Short name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Ww => "ww",
            Self::Wr => "wr",
            Self::Rw => "rw",
            Self::Realtime => "realtime",
        }
    }
}

/// One edge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Edge {
    /// Target transaction.
    pub to: u32,
    /// Kind.
    pub kind: EdgeKind,
    /// Key index (unused for real-time edges).
    pub key: u32,
}

/// A step of a cycle: `from` reaches `edge.to` through `edge`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    /// Source transaction.
    pub from: u32,
    /// The edge taken.
    pub edge: Edge,
}

/// Adjacency lists over transaction numbers.
#[derive(Clone, Debug, Default)]
pub struct Graph {
    adjacency: Vec<Vec<Edge>>,
    edges: [u64; 4],
}

impl Graph {
    /// A graph of `nodes` transactions and no edges.
    pub fn new(nodes: usize) -> Self {
        Self { adjacency: vec![Vec::new(); nodes], edges: [0; 4] }
    }

    /// Adds an edge; self-edges are ignored (a transaction never depends on itself).
    pub fn add(&mut self, from: u32, to: u32, kind: EdgeKind, key: u32) {
        if from == to {
            return;
        }
        self.adjacency[from as usize].push(Edge { to, kind, key });
        self.edges[kind.bit().trailing_zeros() as usize] += 1;
    }

    /// The same graph without the edges that touch a node not in `keep`.
    pub fn restricted(&self, keep: &[bool]) -> Graph {
        let mut graph = Graph::new(self.adjacency.len());
        for (from, edges) in self.adjacency.iter().enumerate() {
            if !keep[from] {
                continue;
            }
            for edge in edges.iter().filter(|e| keep[e.to as usize]) {
                graph.add(from as u32, edge.to, edge.kind, edge.key);
            }
        }
        graph
    }

    /// Edges added, by kind: ww, wr, rw, realtime.
    pub fn edge_counts(&self) -> [u64; 4] {
        self.edges
    }

    /// Strongly connected components with more than one node.
    pub fn cycles_components(&self) -> Vec<Vec<u32>> {
        tarjan(&self.adjacency).into_iter().filter(|c| c.len() > 1).collect()
    }

    /// The smallest cycle found in `component` using only edges in `allowed`; with
    /// `rw_exactly_one`, only cycles with exactly one anti-dependency. Returns the steps in order.
    pub fn smallest_cycle(
        &self,
        component: &[u32],
        allowed: &[EdgeKind],
        rw_exactly_one: bool,
    ) -> Option<Vec<Step>> {
        let mut member = vec![false; self.adjacency.len()];
        for &n in component {
            member[n as usize] = true;
        }
        let mask = allowed.iter().fold(0u8, |m, k| m | k.bit());
        let mut best: Option<Vec<Step>> = None;
        if rw_exactly_one {
            // One anti-dependency a -> b closed by a path b -> a without any.
            let path_mask = mask & !EdgeKind::Rw.bit();
            let mut starts = 0;
            'outer: for &a in component {
                for edge in &self.adjacency[a as usize] {
                    if edge.kind != EdgeKind::Rw || !member[edge.to as usize] {
                        continue;
                    }
                    if starts == CYCLE_SEARCH_STARTS_MAX {
                        break 'outer;
                    }
                    starts += 1;
                    if let Some(path) = self.shortest_path(edge.to, a, path_mask, &member) {
                        let mut cycle = vec![Step { from: a, edge: *edge }];
                        cycle.extend(path);
                        if best.as_ref().is_none_or(|b| cycle.len() < b.len()) {
                            best = Some(cycle);
                        }
                    }
                }
            }
            return best;
        }
        for &start in component.iter().take(CYCLE_SEARCH_STARTS_MAX) {
            // The shortest path from start back to itself.
            if let Some(cycle) = self.shortest_path(start, start, mask, &member) {
                if best.as_ref().is_none_or(|b| cycle.len() < b.len()) {
                    best = Some(cycle);
                }
                if best.as_ref().is_some_and(|b| b.len() == 2) {
                    break;
                }
            }
        }
        best
    }

    /// Breadth-first shortest path from `from` to `to` (a cycle when they are equal) over edges
    /// in `mask` between members.
    fn shortest_path(&self, from: u32, to: u32, mask: u8, member: &[bool]) -> Option<Vec<Step>> {
        let mut parent: Vec<Option<Step>> = vec![None; self.adjacency.len()];
        let mut seen = vec![false; self.adjacency.len()];
        seen[from as usize] = true;
        let mut queue = VecDeque::from([from]);
        while let Some(n) = queue.pop_front() {
            for edge in &self.adjacency[n as usize] {
                let t = edge.to as usize;
                if mask & edge.kind.bit() == 0 || !member[t] {
                    continue;
                }
                if edge.to == to {
                    let mut path = vec![Step { from: n, edge: *edge }];
                    let mut at = n;
                    while at != from {
                        let step = parent[at as usize].expect("on the path");
                        path.push(step);
                        at = step.from;
                    }
                    path.reverse();
                    return Some(path);
                }
                if seen[t] {
                    continue;
                }
                seen[t] = true;
                parent[t] = Some(Step { from: n, edge: *edge });
                queue.push_back(edge.to);
            }
        }
        None
    }
}

/// Iterative Tarjan: components in reverse topological order.
fn tarjan(adjacency: &[Vec<Edge>]) -> Vec<Vec<u32>> {
    const UNSEEN: u32 = u32::MAX;
    let n = adjacency.len();
    let mut index = vec![UNSEEN; n];
    let mut low = vec![0u32; n];
    let mut on_stack = vec![false; n];
    let mut stack: Vec<u32> = Vec::new();
    let mut components = Vec::new();
    let mut next_index = 0u32;
    // Call stack of (node, next edge position).
    let mut calls: Vec<(u32, usize)> = Vec::new();
    for root in 0..n as u32 {
        if index[root as usize] != UNSEEN {
            continue;
        }
        calls.push((root, 0));
        while let Some(&mut (v, ref mut pos)) = calls.last_mut() {
            let vi = v as usize;
            if *pos == 0 && index[vi] == UNSEEN {
                index[vi] = next_index;
                low[vi] = next_index;
                next_index += 1;
                stack.push(v);
                on_stack[vi] = true;
            }
            if let Some(edge) = adjacency[vi].get(*pos) {
                *pos += 1;
                let w = edge.to as usize;
                if index[w] == UNSEEN {
                    calls.push((edge.to, 0));
                } else if on_stack[w] {
                    low[vi] = low[vi].min(index[w]);
                }
                continue;
            }
            calls.pop();
            if let Some(&(parent, _)) = calls.last() {
                low[parent as usize] = low[parent as usize].min(low[vi]);
            }
            if low[vi] == index[vi] {
                let mut component = Vec::new();
                loop {
                    let w = stack.pop().expect("tarjan stack holds the component");
                    on_stack[w as usize] = false;
                    component.push(w);
                    if w == v {
                        break;
                    }
                }
                components.push(component);
            }
        }
    }
    components
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn components_and_smallest_cycles() {
        // 0 -> 1 -> 2 -> 0 (ww), 2 -> 3 (wr), 3 -> 2 (rw), 4 alone.
        let mut g = Graph::new(5);
        g.add(0, 1, EdgeKind::Ww, 0);
        g.add(1, 2, EdgeKind::Ww, 0);
        g.add(2, 0, EdgeKind::Ww, 0);
        g.add(2, 3, EdgeKind::Wr, 1);
        g.add(3, 2, EdgeKind::Rw, 1);
        let components = g.cycles_components();
        assert_eq!(components.len(), 1);
        let mut c = components[0].clone();
        c.sort_unstable();
        assert_eq!(c, vec![0, 1, 2, 3]);
        let g0 = g.smallest_cycle(&c, &[EdgeKind::Ww], false).expect("a ww cycle");
        assert_eq!(g0.len(), 3);
        let single = g.smallest_cycle(&c, &[EdgeKind::Ww, EdgeKind::Wr, EdgeKind::Rw], true);
        assert_eq!(single.expect("one rw").len(), 2);
        assert!(g.smallest_cycle(&c, &[EdgeKind::Wr], false).is_none());
    }

    #[test]
    fn a_long_chain_has_no_component_and_does_not_overflow_the_stack() {
        let n = 200_000u32;
        let mut g = Graph::new(n as usize);
        for i in 0..n - 1 {
            g.add(i, i + 1, EdgeKind::Ww, 0);
        }
        assert!(g.cycles_components().is_empty());
        g.add(n - 1, 0, EdgeKind::Rw, 0);
        assert_eq!(g.cycles_components()[0].len(), n as usize);
    }
}
