//! Evidence asks: a validator may ask for its draw and no more.

use super::validation::{completed_by, start, until_held, validated_spec, validator};
use super::*;
use crate::validation::sample::SampleRate;

#[test]
fn a_validator_may_ask_for_its_draw_and_no_more() {
    let mut spec = validated_spec();
    spec.micro_batches_per_epoch = 64;
    let mut s = start(spec);
    let w = until_held(&mut s);
    let m0 = peer(0);
    let completed = completed_by(&w, m0);
    // The run's rate draws max(4, 3% of n) of a miner's n attempts.
    let draw = SampleRate { rate: 0.03, min_per_miner: 4 }.count(completed.len());
    assert!(completed.len() > draw, "more completed ({}) than a draw ({draw})", completed.len());
    let requests = |s: &Sim| {
        s.validation_heard
            .iter()
            .filter_map(|o| match &o.cmd {
                pb::command::Kind::EvidenceRequest(r) if o.to == m0 => Some(r.items.len()),
                _ => None,
            })
            .sum::<usize>()
    };
    // A hostile validator asking for every attempt is refused whole: the
    // miner is asked for nothing.
    let all = Event::EvidenceAsk {
        validator: validator(1),
        epoch: 0,
        miner: m0,
        items: completed.clone(),
        inner_step: None,
        trace: None,
    };
    let refused = s.o.step(s.now, all, &mut s.rng);
    assert!(matches!(&refused, Err(Refusal::Invalid(why)) if why.contains("its draw is")), "{refused:?}");
    s.drain();
    assert_eq!(requests(&s), 0);
    // Its draw, asked in two parts and then again (a re-ask), is fine.
    let (first, second) = completed[..draw].split_at(1);
    for items in [first.to_vec(), second.to_vec(), completed[..draw].to_vec()] {
        let ask =
            Event::EvidenceAsk { validator: validator(1), epoch: 0, miner: m0, items, inner_step: None, trace: None };
        s.inbox.extend(s.o.step(s.now, ask, &mut s.rng).unwrap());
    }
    s.drain();
    assert_eq!(requests(&s), draw + draw, "asked of the miner once each, and again on the re-ask");
    // One attempt more is refused, alone too.
    let more = Event::EvidenceAsk {
        validator: validator(1),
        epoch: 0,
        miner: m0,
        items: vec![completed[draw]],
        inner_step: None,
        trace: None,
    };
    assert!(matches!(s.o.step(s.now, more, &mut s.rng), Err(Refusal::Invalid(_))));
    // The other validator's own draw is its own: not counted against it.
    let other: Vec<WorkKey> = completed[completed.len() - draw..].to_vec();
    let ask = Event::EvidenceAsk {
        validator: validator(0),
        epoch: 0,
        miner: m0,
        items: other,
        inner_step: None,
        trace: None,
    };
    assert!(s.o.step(s.now, ask, &mut s.rng).is_ok());
}

/// Beyond its draw, a validator may ask a miner only for attempts it
/// already asked of the miner downstream on their pathway (both ends of a
/// gradient lane, `validation::lanes`): at most one more per attempt asked
/// downstream.
#[test]
fn beyond_its_draw_a_validator_may_ask_only_for_attempts_asked_downstream() {
    let mut spec = validated_spec();
    spec.micro_batches_per_epoch = 64;
    let mut s = start(spec);
    let w = until_held(&mut s);
    let m0 = peer(0);
    let mine = w.miners.iter().find(|m| m.peer == m0.0.to_vec()).unwrap();
    assert_eq!(mine.stage, 0, "a head");
    let downstream_of = |k: &WorkKey| -> PeerId {
        let item =
            mine.items.iter().find(|i| i.mb.is_some_and(|r| (r.shard, r.first_sample, r.attempt) == *k)).unwrap();
        PeerId(item.pathway[1].as_slice().try_into().unwrap())
    };
    let completed = completed_by(&w, m0);
    let draw = SampleRate { rate: 0.03, min_per_miner: 4 }.count(completed.len());
    let ask = |s: &mut Sim, miner: PeerId, items: Vec<WorkKey>| {
        let r = s.o.step(
            s.now,
            Event::EvidenceAsk { validator: validator(1), epoch: 0, miner, items, inner_step: None, trace: None },
            &mut s.rng,
        );
        r.map(|out| s.inbox.extend(out))
    };
    ask(&mut s, m0, completed[..draw].to_vec()).unwrap();
    let (extra, other) = (completed[draw], completed[draw + 1]);
    assert!(matches!(ask(&mut s, m0, vec![extra]), Err(Refusal::Invalid(_))), "past its draw");
    // Asked of the miner downstream of it first, the attempt may be asked
    // of the head too (its record of the gradient it received).
    ask(&mut s, downstream_of(&extra), vec![extra]).unwrap();
    ask(&mut s, m0, vec![extra]).expect("asked downstream first");
    assert!(matches!(ask(&mut s, m0, vec![other]), Err(Refusal::Invalid(_))), "not asked downstream");
    // Another validator's asks downstream open nothing for this one.
    let by_other = Event::EvidenceAsk {
        validator: validator(0),
        epoch: 0,
        miner: downstream_of(&other),
        items: vec![other],
        inner_step: None,
        trace: None,
    };
    s.inbox.extend(s.o.step(s.now, by_other, &mut s.rng).unwrap());
    assert!(matches!(ask(&mut s, m0, vec![other]), Err(Refusal::Invalid(_))), "asked downstream by another");
}

/// Validator `v`'s epoch-0 ask of `miner`'s `items`, one of them with its
/// inner steps and, with `trace`, the trace of one of its steps.
fn step_ask(
    v: u8,
    miner: PeerId,
    items: Vec<WorkKey>,
    (inner_step, trace): (Option<WorkKey>, Option<(WorkKey, u32)>),
) -> Event {
    Event::EvidenceAsk { validator: validator(v), epoch: 0, miner, items, inner_step, trace }
}

/// The inner steps of one attempt per miner: asked of the miner once,
/// writable and announced under their own key; the plain object of the
/// same attempt does not reach a validator waiting for the steps, the one
/// with the steps reaches every asker; a second step attempt of the same
/// miner, or one not among the items, is refused.
#[test]
fn the_inner_steps_of_one_attempt_per_miner_are_asked_once_and_reach_every_asker() {
    use iota_wire::store_keys::{evidence_key, step_evidence_key};
    let mut s = start(validated_spec());
    let w = until_held(&mut s);
    let m0 = peer(0);
    let stage = s.o.miner(&m0).unwrap().stage;
    let done = completed_by(&w, m0);
    let (k0, k1) = (done[0], done[1]);
    let ask = |v: u8, items: Vec<WorkKey>, inner_step| step_ask(v, m0, items, (inner_step, None));
    // Validator 1 asks plainly first, validator 0 then with the steps.
    s.inbox.extend(s.o.step(s.now, ask(1, vec![k0], None), &mut s.rng).unwrap());
    s.inbox.extend(s.o.step(s.now, ask(0, vec![k0, k1], Some(k0)), &mut s.rng).unwrap());
    s.drain();
    let requested: Vec<pb::WorkRef> = s
        .validation_heard
        .iter()
        .filter_map(|o| match &o.cmd {
            pb::command::Kind::EvidenceRequest(r) if o.to == m0 => Some(r.items.clone()),
            _ => None,
        })
        .flatten()
        .collect();
    let wr =
        |k: WorkKey, inner_step| pb::WorkRef { shard: k.0, first_sample: k.1, attempt: k.2, inner_step, trace_step: 0 };
    assert_eq!(requested, vec![wr(k0, false), wr(k0, true), wr(k1, false)], "each object asked once");
    let (plain, steps) = (evidence_key(0, &m0, k0.0, k0.1, k0.2), step_evidence_key(0, &m0, k0.0, k0.1, k0.2));
    assert!(s.o.may_write(m0, &steps).is_ok());
    let k1_steps = step_evidence_key(0, &m0, k1.0, k1.1, k1.2);
    assert!(s.o.may_write(m0, &k1_steps).is_err(), "nobody asked k1's steps");
    // A second step attempt of the same miner, or one not asked, is refused.
    let again = s.o.step(s.now, ask(0, vec![k1], Some(k1)), &mut s.rng);
    assert!(matches!(&again, Err(Refusal::Invalid(w)) if w.contains("one per miner")), "{again:?}");
    let outside = s.o.step(s.now, ask(1, vec![k1], Some(k0)), &mut s.rng);
    assert!(matches!(&outside, Err(Refusal::Invalid(w)) if w.contains("without the attempt")), "{outside:?}");
    let handed = |s: &Sim, v: u8, key: &str| {
        s.stored_heard.iter().filter(|(to, st)| *to == validator(v) && st.object.as_ref().unwrap().key == key).count()
    };
    for key in [&plain, &steps] {
        let object = StoredObject::of(key, b"bundle", m0);
        s.inbox.extend(s.o.step(s.now, Event::Stored { peer: m0, epoch: 0, stage, object }, &mut s.rng).unwrap());
        s.drain();
    }
    assert_eq!((handed(&s, 1, &plain), handed(&s, 1, &steps)), (1, 1), "the plain asker gets both");
    assert_eq!((handed(&s, 0, &plain), handed(&s, 0, &steps)), (0, 1), "the step asker only the steps");
    assert!(s.o.may_read(validator(0), &steps).is_ok());
}

/// A miner's signed trace of a failed inner step: asked only by a
/// validator that asked the attempt's steps and once they are stored,
/// relayed to the miner once, writable under its own key, handed to every
/// validator that asked it; one trace per miner and validator a round.
#[test]
fn a_trace_is_asked_after_the_steps_relayed_once_and_reaches_its_askers() {
    use iota_wire::store_keys::{step_evidence_key, trace_evidence_key};
    let mut s = start(validated_spec());
    let w = until_held(&mut s);
    let m0 = peer(0);
    let stage = s.o.miner(&m0).unwrap().stage;
    let done = completed_by(&w, m0);
    let (k0, k1) = (done[0], done[1]);
    let ask = |v: u8, items: Vec<WorkKey>, inner_step| step_ask(v, m0, items, (inner_step, None));
    let trace = |v: u8, k: WorkKey, step: u32| step_ask(v, m0, vec![k], (Some(k), Some((k, step))));
    s.inbox.extend(s.o.step(s.now, ask(0, vec![k0], Some(k0)), &mut s.rng).unwrap());
    s.inbox.extend(s.o.step(s.now, ask(1, vec![k0], Some(k0)), &mut s.rng).unwrap());
    s.drain();
    let early = s.o.step(s.now, trace(0, k0, 3), &mut s.rng);
    assert!(matches!(&early, Err(Refusal::Invalid(w)) if w.contains("before its inner steps are stored")), "{early:?}");
    let steps = step_evidence_key(0, &m0, k0.0, k0.1, k0.2);
    let object = StoredObject::of(&steps, b"steps", m0);
    s.inbox.extend(s.o.step(s.now, Event::Stored { peer: m0, epoch: 0, stage, object }, &mut s.rng).unwrap());
    s.drain();
    let stranger = s.o.step(s.now, trace(0, k1, 3), &mut s.rng);
    assert!(matches!(&stranger, Err(Refusal::Invalid(w)) if w.contains("did not ask its inner steps")), "{stranger:?}");
    let from = s.validation_heard.len();
    for v in [0, 1] {
        s.inbox.extend(s.o.step(s.now, trace(v, k0, 3), &mut s.rng).unwrap());
    }
    s.drain();
    let relayed: Vec<pb::WorkRef> = s.validation_heard[from..]
        .iter()
        .filter_map(|o| match &o.cmd {
            pb::command::Kind::EvidenceRequest(r) if o.to == m0 => Some(r.items.clone()),
            _ => None,
        })
        .flatten()
        .collect();
    let want = pb::WorkRef { shard: k0.0, first_sample: k0.1, attempt: k0.2, inner_step: true, trace_step: 4 };
    assert_eq!(relayed, vec![want], "asked of the miner once");
    let key = trace_evidence_key(0, &m0, k0, 3);
    assert!(s.o.may_write(m0, &key).is_ok());
    assert!(s.o.may_write(m0, &trace_evidence_key(0, &m0, k0, 4)).is_err(), "another step's trace was not asked");
    let another = s.o.step(s.now, trace(0, k0, 5), &mut s.rng);
    assert!(matches!(&another, Err(Refusal::Invalid(w)) if w.contains("one per miner")), "{another:?}");
    let object = StoredObject::of(&key, b"trace", m0);
    s.inbox.extend(s.o.step(s.now, Event::Stored { peer: m0, epoch: 0, stage, object }, &mut s.rng).unwrap());
    s.drain();
    let handed = |s: &Sim, v: u8| {
        s.stored_heard.iter().filter(|(to, st)| *to == validator(v) && st.object.as_ref().unwrap().key == key).count()
    };
    assert_eq!((handed(&s, 0), handed(&s, 1)), (1, 1), "every asker gets the trace");
    assert!(s.o.may_read(validator(1), &key).is_ok());
    let unasked = StoredObject::of(&trace_evidence_key(0, &m0, k1, 0), b"trace", m0);
    let refused = s.o.step(s.now, Event::Stored { peer: m0, epoch: 0, stage, object: unasked }, &mut s.rng);
    assert!(refused.is_err(), "a trace nobody asked for");
}
