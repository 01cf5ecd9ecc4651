//! pr: reservations and unit attentions of a logical unit (SPC-4 §5.9, SPC-2 §5.5), pure.
//!
//! Theory of operation
//! -------------------
//! Every volume served over iSCSI has one [`SharedUnit`] in the server's [`Units`] map
//! (keyed by export name, created by the first login to the volume), shared by all its
//! sessions. An I_T nexus is named by the initiator port, `InitiatorName,i,0xISID`
//! ([`nexus_name`]); there is one target port.
//!
//! The unit's [`UnitState`] holds:
//! * the persistent reservation state [`PrState`]: registrations (nexus -> key, in
//!   registration order, at most [`REGISTRATIONS_MAX`]), the reservation (holder and
//!   type), the PRgeneration and APTPL;
//! * the SPC-2 reservation of RESERVE(6)/(10), if any (released by RELEASE, a LUN
//!   reset, a target warm reset, or the end of the holder's session);
//! * per attached nexus (a nexus with a session), its pending unit attentions (at most
//!   [`ATTENTIONS_MAX`]; a unit attention for a nexus without a session is dropped).
//!
//! The connection calls [`UnitState::check`] before every command of LUN 0: a pending
//! unit attention is reported first (CHECK CONDITION, UNIT ATTENTION; INQUIRY, REPORT
//! LUNS and REQUEST SENSE are exempt, REQUEST SENSE returns it as its data), then a
//! command the reservations forbid gets RESERVATION CONFLICT.
//!
//! PERSISTENT RESERVE OUT is applied to a copy of [`PrState`]; the copy replaces the
//! state only when the whole service action succeeded (and, with APTPL, when its
//! encoding fits [`PERSISTED_MAX_BYTES`]). With APTPL the caller stores
//! [`PrState::encode`] in the volume (an internal property) before answering, and
//! loads it with [`PrState::decode`] when the unit state is created; without APTPL the
//! state lives in memory only.
//!
//! PREEMPT AND ABORT removes registrations as PREEMPT does; commands of the preempted
//! nexuses already running complete normally.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::sense::Sense;

/// Registrations a logical unit keeps.
pub const REGISTRATIONS_MAX: usize = 256;
/// Unit attentions pending per I_T nexus (further ones are dropped).
pub const ATTENTIONS_MAX: usize = 8;
/// Longest initiator port name (223-byte iSCSI name, ",i,0x" and 12 hex digits).
pub const NEXUS_NAME_MAX_BYTES: usize = 256;
/// Longest encoded persistent state (the volume property holding it).
pub const PERSISTED_MAX_BYTES: usize = 64 << 10;
/// Logical units (volumes) with reservation state in the server's map.
pub const UNITS_MAX: usize = 4096;
/// Bytes of a PERSISTENT RESERVE OUT parameter list (without SPEC_I_PT).
pub const PARAMETER_LIST_BYTES: usize = 24;

/// The volume property (internal: not listed, not settable) holding the APTPL state.
pub const PROPERTY: &str = "_iscsi_pr";

pub const STATUS_RESERVATION_CONFLICT: u8 = 0x18;

pub const INSUFFICIENT_REGISTRATION_RESOURCES: Sense = Sense { key: 0x05, asc: 0x55, ascq: 0x04, field: None };
pub const INVALID_RELEASE: Sense = Sense { key: 0x05, asc: 0x26, ascq: 0x04, field: None };
pub const UA_RESERVATIONS_PREEMPTED: Sense = Sense { key: 0x06, asc: 0x2a, ascq: 0x03, field: None };
pub const UA_RESERVATIONS_RELEASED: Sense = Sense { key: 0x06, asc: 0x2a, ascq: 0x04, field: None };
pub const UA_REGISTRATIONS_PREEMPTED: Sense = Sense { key: 0x06, asc: 0x2a, ascq: 0x05, field: None };
pub const UA_MODE_PARAMETERS_CHANGED: Sense = Sense { key: 0x06, asc: 0x2a, ascq: 0x01, field: None };
pub const UA_CAPACITY_DATA_CHANGED: Sense = Sense { key: 0x06, asc: 0x2a, ascq: 0x09, field: None };
pub const UA_LUN_RESET: Sense = Sense { key: 0x06, asc: 0x29, ascq: 0x03, field: None };
pub const UA_TARGET_RESET: Sense = Sense { key: 0x06, asc: 0x29, ascq: 0x02, field: None };

/// The initiator port of a session: `InitiatorName,i,0xISID`.
pub fn nexus_name(initiator_name: &str, isid: [u8; 6]) -> String {
    let mut name: String = initiator_name.chars().take(223).collect();
    name.push_str(",i,0x");
    for b in isid {
        name.push_str(&format!("{b:02x}"));
    }
    name
}

/// A persistent reservation type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrType {
    WriteExclusive = 1,
    ExclusiveAccess = 3,
    WriteExclusiveRegistrantsOnly = 5,
    ExclusiveAccessRegistrantsOnly = 6,
    WriteExclusiveAllRegistrants = 7,
    ExclusiveAccessAllRegistrants = 8,
}

impl PrType {
    pub fn from_code(code: u8) -> Option<PrType> {
        Some(match code {
            1 => PrType::WriteExclusive,
            3 => PrType::ExclusiveAccess,
            5 => PrType::WriteExclusiveRegistrantsOnly,
            6 => PrType::ExclusiveAccessRegistrantsOnly,
            7 => PrType::WriteExclusiveAllRegistrants,
            8 => PrType::ExclusiveAccessAllRegistrants,
            _ => return None,
        })
    }
    fn code(self) -> u8 {
        self as u8
    }
    fn all_registrants(self) -> bool {
        matches!(self, PrType::WriteExclusiveAllRegistrants | PrType::ExclusiveAccessAllRegistrants)
    }
    fn registrants_only(self) -> bool {
        matches!(self, PrType::WriteExclusiveRegistrantsOnly | PrType::ExclusiveAccessRegistrantsOnly)
    }
    /// Registered nexuses that do not hold it have the holder's access.
    fn shared_by_registrants(self) -> bool {
        self.all_registrants() || self.registrants_only()
    }
    /// Only writes are reserved (reads stay open to everyone).
    fn writes_only(self) -> bool {
        matches!(self, PrType::WriteExclusive | PrType::WriteExclusiveRegistrantsOnly | PrType::WriteExclusiveAllRegistrants)
    }
}

/// A persistent reservation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    /// The nexus that established it (for the all-registrants types, every registered
    /// nexus holds it).
    pub holder: String,
    pub kind: PrType,
}

/// A reservation command, decoded from its CDB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// RESERVE(6) or RESERVE(10).
    Reserve,
    /// RELEASE(6) or RELEASE(10).
    Release,
    /// PERSISTENT RESERVE IN.
    In { service_action: u8, allocation: u16 },
    /// PERSISTENT RESERVE OUT, its parameter list to come as Data-Out.
    Out { service_action: u8, kind: u8, parameter_bytes: u32 },
}

/// Decode RESERVE/RELEASE (6, 10) and PERSISTENT RESERVE IN/OUT (`c` is the CDB).
pub fn decode(c: &[u8; 16]) -> Result<Command, Sense> {
    match c[0] {
        // third-party and extent reservations are not supported
        0x16 | 0x17 if c[1] & 0x1f != 0 => Err(Sense::INVALID_FIELD_IN_CDB),
        0x56 | 0x57 if c[1] & 0x13 != 0 => Err(Sense::INVALID_FIELD_IN_CDB),
        0x16 | 0x56 => Ok(Command::Reserve),
        0x17 | 0x57 => Ok(Command::Release),
        0x5e => {
            let service_action = c[1] & 0x1f;
            if service_action > 3 {
                return Err(Sense::INVALID_FIELD_IN_CDB);
            }
            Ok(Command::In { service_action, allocation: u16::from_be_bytes([c[7], c[8]]) })
        }
        0x5f => {
            let service_action = c[1] & 0x1f;
            let (scope, kind) = (c[2] >> 4, c[2] & 0x0f);
            match service_action {
                // REGISTER, REGISTER AND IGNORE EXISTING KEY, CLEAR: scope and type ignored
                0 | 3 | 6 => {}
                1 | 2 | 4 | 5 => {
                    // PREEMPT with a zero service action key may leave the type unused,
                    // but a type is always checked when given
                    if scope != 0 || PrType::from_code(kind).is_none() {
                        return Err(Sense::INVALID_FIELD_IN_CDB);
                    }
                }
                // REGISTER AND MOVE and anything beyond
                _ => return Err(Sense::INVALID_FIELD_IN_CDB),
            }
            let parameter_bytes = u32::from_be_bytes([c[5], c[6], c[7], c[8]]);
            Ok(Command::Out { service_action, kind, parameter_bytes })
        }
        _ => Err(Sense::INVALID_OPCODE),
    }
}

/// Why a reservation command or a checked command does not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// RESERVATION CONFLICT status, no sense.
    Conflict,
    /// CHECK CONDITION with this sense.
    Check(Sense),
}

/// What to do with a command, decided before it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Run,
    Refuse(Refusal),
    /// REQUEST SENSE with a unit attention pending: answer it as the sense data.
    SenseData(Sense),
}

/// How a command fares against a persistent reservation it does not share.
#[derive(PartialEq, Eq)]
enum Access {
    /// Allowed whatever the reservation.
    Always,
    /// Reads: allowed under the write-exclusive types.
    Read,
    /// Everything else (writes, MODE SENSE/SELECT, SYNCHRONIZE CACHE, ...).
    Conflict,
}

/// SPC-4 table "SPC commands that are allowed in the presence of various reservations"
/// and the SBC-3 table for the block commands.
fn access_class(c: &[u8]) -> Access {
    let service_action = c.get(1).map_or(0, |b| b & 0x1f);
    match c[0] {
        // INQUIRY, REPORT LUNS, REQUEST SENSE, PR IN/OUT, LOG SENSE, TEST UNIT READY,
        // READ CAPACITY (10, 16), REPORT SUPPORTED OPERATION CODES (MAINTENANCE IN)
        0x12 | 0xa0 | 0x03 | 0x5e | 0x5f | 0x4d | 0x00 | 0x25 | 0xa3 => Access::Always,
        0x9e if service_action == 0x10 => Access::Always,
        // READ, VERIFY, PRE-FETCH, GET LBA STATUS
        0x08 | 0x28 | 0xa8 | 0x88 | 0x2f | 0xaf | 0x8f | 0x34 | 0x90 => Access::Read,
        0x9e if service_action == 0x12 => Access::Read,
        _ => Access::Conflict,
    }
}

/// What another nexus may do while a RESERVE(6)/(10) reservation is held (SPC-2).
fn allowed_under_reserve6(opcode: u8) -> bool {
    // INQUIRY, REPORT LUNS, REQUEST SENSE, RELEASE (a no-op), LOG SENSE, READ CAPACITY
    matches!(opcode, 0x12 | 0xa0 | 0x03 | 0x17 | 0x57 | 0x4d | 0x25 | 0x9e)
}

/// The persistent reservation state of a logical unit (what APTPL keeps).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PrState {
    /// (nexus, key), in registration order; keys are non-zero.
    registrations: Vec<(String, u64)>,
    reservation: Option<Reservation>,
    generation: u32,
    aptpl: bool,
}

/// The parameter list of PERSISTENT RESERVE OUT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutParameters {
    pub key: u64,
    pub service_action_key: u64,
    pub aptpl: bool,
}

/// Unit attentions a state change establishes: (nexus, sense).
type Attentions = Vec<(String, Sense)>;

impl PrState {
    pub fn generation(&self) -> u32 {
        self.generation
    }
    pub fn aptpl(&self) -> bool {
        self.aptpl
    }
    pub fn reservation(&self) -> Option<&Reservation> {
        self.reservation.as_ref()
    }
    pub fn key_of(&self, nexus: &str) -> Option<u64> {
        self.registrations.iter().find(|(n, _)| n == nexus).map(|(_, k)| *k)
    }
    pub fn registered(&self) -> usize {
        self.registrations.len()
    }
    fn is_holder(&self, nexus: &str) -> bool {
        match &self.reservation {
            Some(r) if r.kind.all_registrants() => self.key_of(nexus).is_some(),
            Some(r) => r.holder == nexus,
            None => false,
        }
    }
    /// Nothing registered, nothing reserved.
    pub fn is_empty(&self) -> bool {
        self.registrations.is_empty() && self.reservation.is_none()
    }

    /// Whether `nexus` may run the command of CDB `c` under the persistent reservation.
    pub fn allows(&self, nexus: &str, c: &[u8]) -> bool {
        let Some(r) = &self.reservation else { return true };
        if self.is_holder(nexus) || (r.kind.shared_by_registrants() && self.key_of(nexus).is_some()) {
            return true;
        }
        match access_class(c) {
            Access::Always => true,
            Access::Read => r.kind.writes_only(),
            Access::Conflict => false,
        }
    }

    /// Attentions `sense` for every registered nexus but `except`.
    fn to_registrants(&self, except: &str, sense: Sense) -> Attentions {
        self.registrations.iter().filter(|(n, _)| n != except).map(|(n, _)| (n.clone(), sense)).collect()
    }

    /// Remove `nexus`'s registration; releases a reservation it held alone.
    fn unregister(&mut self, nexus: &str) -> Attentions {
        self.registrations.retain(|(n, _)| n != nexus);
        let mut attentions = Vec::new();
        if let Some(r) = self.reservation.clone() {
            if r.kind.all_registrants() {
                if self.registrations.is_empty() {
                    self.reservation = None;
                } else if r.holder == nexus {
                    // another registrant stands for the holder of the shared reservation
                    self.reservation = Some(Reservation { holder: self.registrations[0].0.clone(), kind: r.kind });
                }
            } else if r.holder == nexus {
                self.reservation = None;
                if r.kind.registrants_only() {
                    attentions = self.to_registrants(nexus, UA_RESERVATIONS_RELEASED);
                }
            }
        }
        attentions
    }

    /// Remove the registrations with `key` (not `except`'s); the nexuses removed.
    fn remove_key(&mut self, key: u64, except: &str) -> Vec<String> {
        let removed: Vec<String> = self.registrations.iter().filter(|(n, k)| *k == key && n != except).map(|(n, _)| n.clone()).collect();
        self.registrations.retain(|(n, k)| !(*k == key && n != except));
        removed
    }

    /// PERSISTENT RESERVE OUT `service_action` (type `kind`) from `nexus`.
    pub fn out(&mut self, nexus: &str, service_action: u8, kind: u8, p: OutParameters) -> Result<Attentions, Refusal> {
        let registered = self.key_of(nexus);
        match service_action {
            0 | 6 => self.register(nexus, registered, service_action == 6, p),
            _ if registered != Some(p.key) => Err(Refusal::Conflict),
            1 => {
                let kind = PrType::from_code(kind).ok_or(Refusal::Check(Sense::INVALID_FIELD_IN_CDB))?;
                match &self.reservation {
                    Some(r) if self.is_holder(nexus) && r.kind == kind => Ok(Vec::new()),
                    Some(_) => Err(Refusal::Conflict),
                    None => {
                        self.reservation = Some(Reservation { holder: nexus.to_string(), kind });
                        Ok(Vec::new())
                    }
                }
            }
            2 => {
                let Some(r) = self.reservation.clone() else { return Ok(Vec::new()) };
                if !self.is_holder(nexus) {
                    return Ok(Vec::new());
                }
                if r.kind.code() != kind {
                    return Err(Refusal::Check(INVALID_RELEASE));
                }
                self.reservation = None;
                if r.kind.shared_by_registrants() {
                    return Ok(self.to_registrants(nexus, UA_RESERVATIONS_RELEASED));
                }
                Ok(Vec::new())
            }
            3 => {
                let attentions = self.to_registrants(nexus, UA_RESERVATIONS_PREEMPTED);
                self.registrations.clear();
                self.reservation = None;
                self.generation = self.generation.wrapping_add(1);
                Ok(attentions)
            }
            4 | 5 => self.preempt(nexus, kind, p.service_action_key),
            _ => Err(Refusal::Check(Sense::INVALID_FIELD_IN_CDB)),
        }
    }

    /// REGISTER (`ignore_key`: REGISTER AND IGNORE EXISTING KEY) by `nexus`, whose key
    /// is `registered`.
    fn register(&mut self, nexus: &str, registered: Option<u64>, ignore_key: bool, p: OutParameters) -> Result<Attentions, Refusal> {
        match registered {
            None => {
                if !ignore_key && p.key != 0 {
                    return Err(Refusal::Conflict);
                }
                if p.service_action_key == 0 {
                    return Ok(Vec::new());
                }
                if self.registrations.len() >= REGISTRATIONS_MAX {
                    return Err(Refusal::Check(INSUFFICIENT_REGISTRATION_RESOURCES));
                }
                self.registrations.push((nexus.to_string(), p.service_action_key));
                self.generation = self.generation.wrapping_add(1);
                self.aptpl = p.aptpl;
                Ok(Vec::new())
            }
            Some(key) => {
                if !ignore_key && p.key != key {
                    return Err(Refusal::Conflict);
                }
                let attentions = if p.service_action_key == 0 {
                    self.unregister(nexus)
                } else {
                    if let Some(entry) = self.registrations.iter_mut().find(|(n, _)| n == nexus) {
                        entry.1 = p.service_action_key;
                    }
                    Vec::new()
                };
                self.generation = self.generation.wrapping_add(1);
                self.aptpl = p.aptpl;
                Ok(attentions)
            }
        }
    }

    /// The registrations of `victim_key` removed by `nexus`'s PREEMPT; a key nobody
    /// holds (not even `nexus` itself) is a RESERVATION CONFLICT.
    fn preempt_key(&mut self, victim_key: u64, nexus: &str) -> Result<Vec<String>, Refusal> {
        let removed = self.remove_key(victim_key, nexus);
        if removed.is_empty() && self.key_of(nexus) != Some(victim_key) {
            return Err(Refusal::Conflict);
        }
        Ok(removed)
    }

    /// PREEMPT (and PREEMPT AND ABORT) by registered `nexus`.
    fn preempt(&mut self, nexus: &str, kind: u8, victim_key: u64) -> Result<Attentions, Refusal> {
        let kind = PrType::from_code(kind).ok_or(Refusal::Check(Sense::INVALID_FIELD_IN_CDB))?;
        let preempted = |removed: Vec<String>| -> Attentions { removed.into_iter().map(|n| (n, UA_REGISTRATIONS_PREEMPTED)).collect() };
        let mut attentions = Vec::new();
        match self.reservation.clone() {
            None => {
                if victim_key == 0 {
                    return Err(Refusal::Check(Sense::INVALID_FIELD_IN_PARAMETER_LIST));
                }
                let removed = self.preempt_key(victim_key, nexus)?;
                attentions.extend(preempted(removed));
            }
            Some(r) if r.kind.all_registrants() => {
                if victim_key == 0 {
                    let removed: Vec<String> = self.registrations.iter().filter(|(n, _)| n != nexus).map(|(n, _)| n.clone()).collect();
                    self.registrations.retain(|(n, _)| n == nexus);
                    self.reservation = Some(Reservation { holder: nexus.to_string(), kind });
                    attentions.extend(preempted(removed));
                } else {
                    let removed = self.preempt_key(victim_key, nexus)?;
                    if r.holder != nexus && removed.contains(&r.holder) {
                        self.reservation = Some(Reservation { holder: nexus.to_string(), kind: r.kind });
                    }
                    attentions.extend(preempted(removed));
                }
            }
            Some(r) => {
                let holder_key = self.key_of(&r.holder);
                if holder_key == Some(victim_key) {
                    let removed = self.remove_key(victim_key, nexus);
                    self.reservation = Some(Reservation { holder: nexus.to_string(), kind });
                    if r.kind != kind {
                        let released: Vec<String> = self.registrations.iter().filter(|(n, _)| n != nexus).map(|(n, _)| n.clone()).collect();
                        attentions.extend(released.into_iter().map(|n| (n, UA_RESERVATIONS_RELEASED)));
                    }
                    attentions.extend(preempted(removed));
                } else {
                    if victim_key == 0 {
                        return Err(Refusal::Check(Sense::INVALID_FIELD_IN_PARAMETER_LIST));
                    }
                    let removed = self.preempt_key(victim_key, nexus)?;
                    attentions.extend(preempted(removed));
                }
            }
        }
        self.generation = self.generation.wrapping_add(1);
        Ok(attentions)
    }

    /// PERSISTENT RESERVE IN `service_action`, cut to `allocation` bytes.
    pub fn read(&self, service_action: u8, allocation: usize) -> Result<Vec<u8>, Sense> {
        let mut d = Vec::new();
        d.extend_from_slice(&self.generation.to_be_bytes());
        match service_action {
            0 => {
                // READ KEYS
                d.extend_from_slice(&((self.registrations.len() * 8) as u32).to_be_bytes());
                for (_, key) in &self.registrations {
                    d.extend_from_slice(&key.to_be_bytes());
                }
            }
            1 => {
                // READ RESERVATION
                match &self.reservation {
                    None => d.extend_from_slice(&0u32.to_be_bytes()),
                    Some(r) => {
                        d.extend_from_slice(&16u32.to_be_bytes());
                        let key = if r.kind.all_registrants() { 0 } else { self.key_of(&r.holder).unwrap_or(0) };
                        d.extend_from_slice(&key.to_be_bytes());
                        d.extend_from_slice(&[0, 0, 0, 0, 0, r.kind.code(), 0, 0]);
                    }
                }
            }
            2 => {
                // REPORT CAPABILITIES: PTPL_C, TMV with the six types, PTPL_A
                d.clear();
                d.extend_from_slice(&8u16.to_be_bytes());
                d.push(0x01);
                d.push(0x80 | u8::from(self.aptpl));
                d.push(0x80 | 0x40 | 0x20 | 0x08 | 0x02);
                d.push(0x01);
                d.extend_from_slice(&[0, 0]);
            }
            3 => {
                // READ FULL STATUS
                let mut descriptors = Vec::new();
                for (nexus, key) in &self.registrations {
                    let holder = self.is_holder(nexus);
                    descriptors.extend_from_slice(&key.to_be_bytes());
                    descriptors.extend_from_slice(&[0, 0, 0, 0]);
                    descriptors.push(u8::from(holder));
                    descriptors.push(if holder { self.reservation.as_ref().map_or(0, |r| r.kind.code()) } else { 0 });
                    descriptors.extend_from_slice(&[0, 0, 0, 0]);
                    descriptors.extend_from_slice(&1u16.to_be_bytes()); // relative target port 1
                    let transport_id = iscsi_transport_id(nexus);
                    descriptors.extend_from_slice(&(transport_id.len() as u32).to_be_bytes());
                    descriptors.extend_from_slice(&transport_id);
                }
                d.extend_from_slice(&(descriptors.len() as u32).to_be_bytes());
                d.extend_from_slice(&descriptors);
            }
            _ => return Err(Sense::INVALID_FIELD_IN_CDB),
        }
        d.truncate(allocation);
        Ok(d)
    }

    /// The persistent form (APTPL): one line of ASCII,
    /// `zpr1 GENERATION TYPE HOLDER KEY=NEXUS...` (TYPE 0 and HOLDER `-` without a
    /// reservation; HOLDER the index of the holder's registration; KEY 16 hex digits;
    /// NEXUS with bytes other than `A-Za-z0-9.:,_-` as `%XX`).
    pub fn encode(&self) -> String {
        let holder = self.reservation.as_ref().and_then(|r| self.registrations.iter().position(|(n, _)| *n == r.holder));
        let mut s = format!(
            "zpr1 {} {} {}",
            self.generation,
            self.reservation.as_ref().map_or(0, |r| r.kind.code()),
            holder.map_or("-".to_string(), |i| i.to_string())
        );
        for (nexus, key) in &self.registrations {
            s.push_str(&format!(" {key:016x}="));
            for b in nexus.bytes() {
                if b.is_ascii_alphanumeric() || b".:,_-".contains(&b) {
                    s.push(b as char);
                } else {
                    s.push_str(&format!("%{b:02X}"));
                }
            }
        }
        s
    }

    /// The state [`encode`](Self::encode) wrote (APTPL on); `None` if it is not one.
    pub fn decode(text: &str) -> Option<PrState> {
        if text.len() > PERSISTED_MAX_BYTES {
            return None;
        }
        let mut words = text.split(' ');
        if words.next()? != "zpr1" {
            return None;
        }
        let generation: u32 = words.next()?.parse().ok()?;
        let kind: u8 = words.next()?.parse().ok()?;
        let holder = match words.next()? {
            "-" => None,
            i => Some(i.parse::<usize>().ok()?),
        };
        let mut registrations: Vec<(String, u64)> = Vec::new();
        for word in words {
            if registrations.len() >= REGISTRATIONS_MAX {
                return None;
            }
            let (key, escaped) = word.split_once('=')?;
            let key = u64::from_str_radix(key, 16).ok().filter(|k| *k != 0 && key.len() == 16)?;
            let nexus = unescape(escaped)?;
            if nexus.is_empty() || nexus.len() > NEXUS_NAME_MAX_BYTES || registrations.iter().any(|(n, _)| *n == nexus) {
                return None;
            }
            registrations.push((nexus, key));
        }
        let reservation = match (kind, holder) {
            (0, None) => None,
            (code, Some(i)) => Some(Reservation { holder: registrations.get(i)?.0.clone(), kind: PrType::from_code(code)? }),
            _ => return None,
        };
        Some(PrState { registrations, reservation, generation, aptpl: true })
    }
}

fn unescape(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// An iSCSI TransportID with an ISID (format 01b): the initiator port name,
/// NUL-terminated, padded to a multiple of 4 bytes (at least 20).
fn iscsi_transport_id(nexus: &str) -> Vec<u8> {
    let mut name = nexus.as_bytes().to_vec();
    name.push(0);
    while !name.len().is_multiple_of(4) || name.len() < 16 {
        name.push(0);
    }
    let mut id = vec![0x40 | 0x05, 0];
    id.extend_from_slice(&(name.len() as u16).to_be_bytes());
    id.extend_from_slice(&name);
    id
}

/// A nexus with a session on the unit.
#[derive(Debug, Default)]
struct Attached {
    sessions: usize,
    attentions: VecDeque<Sense>,
}

/// Everything reservations and unit attentions keep for one logical unit.
#[derive(Debug, Default)]
pub struct UnitState {
    pub pr: PrState,
    /// The nexus holding a RESERVE(6)/(10) reservation.
    reserve6: Option<String>,
    attached: HashMap<String, Attached>,
}

impl UnitState {
    pub fn new(pr: PrState) -> UnitState {
        UnitState { pr, reserve6: None, attached: HashMap::new() }
    }

    /// A session of `nexus` starts (no unit attention is raised for it).
    pub fn attach(&mut self, nexus: &str) {
        self.attached.entry(nexus.to_string()).or_default().sessions += 1;
    }

    /// A session of `nexus` ends: the nexus is lost when it was its last, and with it
    /// its unit attentions and its RESERVE(6) reservation.
    pub fn detach(&mut self, nexus: &str) {
        let lost = match self.attached.get_mut(nexus) {
            Some(a) => {
                a.sessions = a.sessions.saturating_sub(1);
                a.sessions == 0
            }
            None => true,
        };
        if lost {
            self.attached.remove(nexus);
            if self.reserve6.as_deref() == Some(nexus) {
                self.reserve6 = None;
            }
        }
    }

    /// Nothing registered or reserved, no unit attention pending.
    fn is_quiet(&self) -> bool {
        self.pr.is_empty() && self.reserve6.is_none() && self.attached.values().all(|a| a.attentions.is_empty())
    }

    /// No session, nothing registered or reserved: the state may be dropped.
    pub fn is_idle(&self) -> bool {
        self.attached.is_empty() && self.pr.is_empty() && self.reserve6.is_none()
    }

    /// Queue `sense` for `nexus` (if it has a session; at most [`ATTENTIONS_MAX`]).
    pub fn raise(&mut self, nexus: &str, sense: Sense) {
        if let Some(a) = self.attached.get_mut(nexus) {
            if a.attentions.len() < ATTENTIONS_MAX && !a.attentions.contains(&sense) {
                a.attentions.push_back(sense);
            }
        }
    }

    /// Queue `sense` for every nexus with a session but `except`.
    pub fn raise_for_others(&mut self, except: &str, sense: Sense) {
        let others: Vec<String> = self.attached.keys().filter(|n| *n != except).cloned().collect();
        for nexus in others {
            self.raise(&nexus, sense);
        }
    }

    /// Before a command of `nexus` with CDB `c` runs.
    pub fn check(&mut self, nexus: &str, c: &[u8]) -> Verdict {
        let opcode = c[0];
        if let Some(a) = self.attached.get_mut(nexus) {
            match opcode {
                0x12 | 0xa0 => {}
                0x03 => {
                    if let Some(sense) = a.attentions.pop_front() {
                        return Verdict::SenseData(sense);
                    }
                }
                _ => {
                    if let Some(sense) = a.attentions.pop_front() {
                        return Verdict::Refuse(Refusal::Check(sense));
                    }
                }
            }
        }
        if let Some(holder) = &self.reserve6 {
            // SPC-3 5.6.1: PR commands conflict while an SPC-2 reservation exists
            if matches!(opcode, 0x5e | 0x5f) || (holder != nexus && !allowed_under_reserve6(opcode)) {
                return Verdict::Refuse(Refusal::Conflict);
            }
        }
        // RESERVE and RELEASE conflict once any nexus is registered
        if matches!(opcode, 0x16 | 0x17 | 0x56 | 0x57) && self.pr.registered() > 0 {
            return Verdict::Refuse(Refusal::Conflict);
        }
        if !self.pr.allows(nexus, c) {
            return Verdict::Refuse(Refusal::Conflict);
        }
        Verdict::Run
    }

    /// RESERVE(6)/(10) (after [`check`](Self::check) let it run).
    pub fn reserve6(&mut self, nexus: &str) -> Result<(), Refusal> {
        match &self.reserve6 {
            Some(holder) if holder != nexus => Err(Refusal::Conflict),
            _ => {
                self.reserve6 = Some(nexus.to_string());
                Ok(())
            }
        }
    }

    /// RELEASE(6)/(10): releases the reservation `nexus` holds; from another, nothing.
    pub fn release6(&mut self, nexus: &str) {
        if self.reserve6.as_deref() == Some(nexus) {
            self.reserve6 = None;
        }
    }

    /// LOGICAL UNIT RESET or TARGET WARM RESET: the RESERVE(6) reservation goes and
    /// every nexus, the requesting one too (SAM-5; libiscsi's MultipathIO.Reset checks
    /// each path), gets `sense`. Persistent reservations stay.
    pub fn reset(&mut self, sense: Sense) {
        self.reserve6 = None;
        let nexuses: Vec<String> = self.attached.keys().cloned().collect();
        for nexus in nexuses {
            self.raise(&nexus, sense);
        }
    }

    /// PERSISTENT RESERVE OUT from `nexus` with its parameter list `parameters`
    /// (`parameter_bytes` as the CDB says). `Ok(Some(text))`: the state changed and is
    /// to be stored as `text` (APTPL on: its encoding; off after being on: "").
    pub fn persistent_reserve_out(
        &mut self,
        nexus: &str,
        service_action: u8,
        kind: u8,
        parameter_bytes: u32,
        parameters: &[u8],
    ) -> Result<Option<String>, Refusal> {
        if (parameter_bytes as usize) < PARAMETER_LIST_BYTES || parameters.len() < PARAMETER_LIST_BYTES {
            return Err(Refusal::Check(Sense::PARAMETER_LIST_LENGTH_ERROR));
        }
        let flags = parameters[20];
        if flags & 0x0c != 0 {
            // SPEC_I_PT, ALL_TG_PT are not supported
            return Err(Refusal::Check(Sense::INVALID_FIELD_IN_PARAMETER_LIST));
        }
        if parameter_bytes as usize != PARAMETER_LIST_BYTES {
            return Err(Refusal::Check(Sense::PARAMETER_LIST_LENGTH_ERROR));
        }
        let key = |at: usize| u64::from_be_bytes(parameters[at..at + 8].try_into().unwrap_or([0; 8]));
        let p = OutParameters { key: key(0), service_action_key: key(8), aptpl: flags & 0x01 != 0 };
        let mut next = self.pr.clone();
        let attentions = next.out(nexus, service_action, kind, p)?;
        let persist = if next.aptpl {
            let text = next.encode();
            if text.len() > PERSISTED_MAX_BYTES {
                return Err(Refusal::Check(INSUFFICIENT_REGISTRATION_RESOURCES));
            }
            (next != self.pr || !self.pr.aptpl).then_some(text)
        } else {
            self.pr.aptpl.then(String::new)
        };
        self.pr = next;
        for (n, sense) in attentions {
            if n != nexus {
                self.raise(&n, sense);
            }
        }
        Ok(persist)
    }
}

/// One logical unit's state, shared by its sessions.
#[derive(Default)]
pub struct SharedUnit {
    state: Mutex<UnitState>,
    /// Nothing registered or reserved and no unit attention pending: every command
    /// runs, and [`check`](Self::check) answers without taking the lock.
    quiet: AtomicBool,
    /// Serialises PERSISTENT RESERVE OUT with the storing of its result, so the
    /// stored state is always the latest.
    pub out_serial: tokio::sync::Mutex<()>,
}

impl SharedUnit {
    fn new(state: UnitState) -> SharedUnit {
        let quiet = AtomicBool::new(state.is_quiet());
        SharedUnit { state: Mutex::new(state), quiet, out_serial: Default::default() }
    }

    /// [`UnitState::check`], without a lock while the unit is quiet.
    pub fn check(&self, nexus: &str, c: &[u8]) -> Verdict {
        if self.quiet.load(Ordering::Acquire) {
            return Verdict::Run;
        }
        self.update(|state| state.check(nexus, c))
    }

    /// Run `f` on the state (under its lock).
    pub fn update<R>(&self, f: impl FnOnce(&mut UnitState) -> R) -> R {
        let mut state = self.state.lock();
        let result = f(&mut state);
        self.quiet.store(state.is_quiet(), Ordering::Release);
        result
    }
}

/// The units of the server, by export name (at most [`UNITS_MAX`]).
#[derive(Default)]
pub struct Units {
    /// Per export: which volume the state belongs to (its `objsetid` and `createtxg`:
    /// a volume destroyed and created again under the same name is another volume, and
    /// its state starts afresh from what it stores) and the state.
    map: Mutex<HashMap<String, (String, Arc<SharedUnit>)>>,
}

impl Units {
    /// Attach a session of `nexus` to `export`'s unit, creating it (from the state
    /// `load` returns, the stored APTPL state) on first use.
    pub fn attach(&self, export: &str, identity: &str, nexus: &str, load: impl FnOnce() -> Option<String>) -> Arc<SharedUnit> {
        let mut map = self.map.lock();
        let unit = match map.get(export) {
            Some((owner, unit)) if owner == identity => unit.clone(),
            _ => {
                map.remove(export);
                if map.len() >= UNITS_MAX {
                    map.retain(|_, (_, u)| !u.update(|s| s.is_idle()));
                }
                let pr = match load() {
                    Some(text) if !text.is_empty() => PrState::decode(&text).unwrap_or_else(|| {
                        tracing::warn!(%export, "iscsi: the stored persistent reservations do not parse; starting without");
                        PrState::default()
                    }),
                    _ => PrState::default(),
                };
                let unit = Arc::new(SharedUnit::new(UnitState::new(pr)));
                if map.len() < UNITS_MAX {
                    map.insert(export.to_string(), (identity.to_string(), unit.clone()));
                }
                unit
            }
        };
        unit.update(|s| s.attach(nexus));
        unit
    }

    /// A session of `nexus` on `export` ends.
    pub fn detach(&self, export: &str, nexus: &str, unit: &Arc<SharedUnit>) {
        let mut map = self.map.lock();
        let idle = unit.update(|s| {
            s.detach(nexus);
            s.is_idle()
        });
        if idle && map.get(export).is_some_and(|(_, u)| Arc::ptr_eq(u, unit)) {
            map.remove(export);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "iqn.a,i,0x000000000001";
    const B: &str = "iqn.b,i,0x000000000002";
    const C: &str = "iqn.c,i,0x000000000003";

    fn params(key: u64, service_action_key: u64, aptpl: bool) -> Vec<u8> {
        let mut p = vec![0u8; 24];
        p[..8].copy_from_slice(&key.to_be_bytes());
        p[8..16].copy_from_slice(&service_action_key.to_be_bytes());
        p[20] = u8::from(aptpl);
        p
    }

    fn out(u: &mut UnitState, nexus: &str, sa: u8, kind: u8, key: u64, sa_key: u64) -> Result<Option<String>, Refusal> {
        u.persistent_reserve_out(nexus, sa, kind, 24, &params(key, sa_key, false))
    }

    fn unit() -> UnitState {
        let mut u = UnitState::default();
        for n in [A, B, C] {
            u.attach(n);
        }
        u
    }

    const READ10: [u8; 10] = [0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0];
    const WRITE10: [u8; 10] = [0x2a, 0, 0, 0, 0, 0, 0, 0, 1, 0];
    const MODE_SENSE6: [u8; 6] = [0x1a, 0, 0x3f, 0, 0xff, 0];
    const INQUIRY: [u8; 6] = [0x12, 0, 0, 0, 36, 0];
    const TUR: [u8; 6] = [0; 6];

    #[test]
    fn nexus_names_carry_the_isid() {
        assert_eq!(nexus_name("iqn.x", [0x80, 0, 0x12, 0x34, 0, 1]), "iqn.x,i,0x800012340001");
    }

    #[test]
    fn conflict_table_per_type() {
        // (type, registered non-holder: read, write; unregistered: read, write)
        let table = [
            (1u8, true, false, true, false),
            (3, false, false, false, false),
            (5, true, true, true, false),
            (6, true, true, false, false),
            (7, true, true, true, false),
            (8, true, true, false, false),
        ];
        for (kind, reg_read, reg_write, unreg_read, unreg_write) in table {
            let mut u = unit();
            out(&mut u, A, 6, 0, 0, 0xa).unwrap();
            out(&mut u, B, 6, 0, 0, 0xb).unwrap();
            out(&mut u, A, 1, kind, 0xa, 0).unwrap();
            let run = |u: &mut UnitState, n: &str, c: &[u8]| u.check(n, c) == Verdict::Run;
            assert!(run(&mut u, A, &READ10) && run(&mut u, A, &WRITE10), "holder of type {kind}");
            assert_eq!(run(&mut u, B, &READ10), reg_read, "registered read, type {kind}");
            assert_eq!(run(&mut u, B, &WRITE10), reg_write, "registered write, type {kind}");
            assert_eq!(run(&mut u, C, &READ10), unreg_read, "unregistered read, type {kind}");
            assert_eq!(run(&mut u, C, &WRITE10), unreg_write, "unregistered write, type {kind}");
            // INQUIRY and TEST UNIT READY always; MODE SENSE conflicts for non-holders
            assert!(run(&mut u, C, &INQUIRY) && run(&mut u, C, &TUR));
            assert!(!run(&mut u, C, &MODE_SENSE6));
            assert_eq!(u.check(C, &WRITE10), Verdict::Refuse(Refusal::Conflict));
        }
    }

    #[test]
    fn register_reserve_release_and_generation() {
        let mut u = unit();
        assert_eq!(out(&mut u, A, 0, 0, 5, 0xa), Err(Refusal::Conflict), "REGISTER with a key when unregistered");
        out(&mut u, A, 0, 0, 0, 0xa).unwrap();
        assert_eq!(u.pr.generation(), 1);
        assert_eq!(out(&mut u, A, 0, 0, 0xb, 0xc), Err(Refusal::Conflict), "wrong key");
        out(&mut u, A, 6, 0, 0, 0xaa).unwrap();
        assert_eq!(u.pr.key_of(A), Some(0xaa));
        assert_eq!(u.pr.generation(), 2);
        assert_eq!(out(&mut u, B, 1, 1, 0xb, 0), Err(Refusal::Conflict), "RESERVE unregistered");
        out(&mut u, A, 1, 1, 0xaa, 0).unwrap();
        out(&mut u, A, 1, 1, 0xaa, 0).unwrap();
        assert_eq!(u.pr.generation(), 2, "RESERVE does not count");
        assert_eq!(out(&mut u, A, 1, 3, 0xaa, 0), Err(Refusal::Conflict), "another type by the holder");
        assert_eq!(out(&mut u, A, 2, 3, 0xaa, 0), Err(Refusal::Check(INVALID_RELEASE)));
        out(&mut u, A, 2, 1, 0xaa, 0).unwrap();
        assert!(u.pr.reservation().is_none());
        // READ KEYS and READ RESERVATION
        let keys = u.pr.read(0, 100).unwrap();
        assert_eq!(keys, [0, 0, 0, 2, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0xaa]);
        assert_eq!(u.pr.read(0, 5).unwrap().len(), 5);
        assert_eq!(u.pr.read(1, 100).unwrap(), [0, 0, 0, 2, 0, 0, 0, 0]);
        out(&mut u, A, 1, 8, 0xaa, 0).unwrap();
        let r = u.pr.read(1, 100).unwrap();
        assert_eq!(r.len(), 24);
        assert_eq!(&r[8..16], &[0; 8], "all-registrants reservations report key 0");
        assert_eq!(r[21], 8);
        assert_eq!(u.pr.read(2, 100).unwrap(), [0, 8, 1, 0x80, 0xea, 1, 0, 0]);
        let full = u.pr.read(3, 1000).unwrap();
        assert_eq!(full[12 + 8], 0x01, "R_HOLDER");
        assert_eq!(full[24] % 4, 0);
    }

    #[test]
    fn parameter_list_checks() {
        let mut u = unit();
        let p = params(0, 1, false);
        assert_eq!(u.persistent_reserve_out(A, 0, 0, 20, &p), Err(Refusal::Check(Sense::PARAMETER_LIST_LENGTH_ERROR)));
        assert_eq!(u.persistent_reserve_out(A, 0, 0, 24, &p[..20]), Err(Refusal::Check(Sense::PARAMETER_LIST_LENGTH_ERROR)));
        let mut spec = p.clone();
        spec[20] = 0x08;
        assert_eq!(u.persistent_reserve_out(A, 0, 0, 24, &spec), Err(Refusal::Check(Sense::INVALID_FIELD_IN_PARAMETER_LIST)));
        spec[20] = 0x04;
        assert_eq!(u.persistent_reserve_out(A, 0, 0, 24, &spec), Err(Refusal::Check(Sense::INVALID_FIELD_IN_PARAMETER_LIST)));
        let mut long = p.clone();
        long.extend_from_slice(&[0; 8]);
        assert_eq!(u.persistent_reserve_out(A, 0, 0, 32, &long), Err(Refusal::Check(Sense::PARAMETER_LIST_LENGTH_ERROR)));
        assert_eq!(u.pr.generation(), 0);
        // CDB decoding
        let cdb = |b: &[u8]| {
            let mut c = [0u8; 16];
            c[..b.len()].copy_from_slice(b);
            c
        };
        assert_eq!(decode(&cdb(&[0x5e, 4])), Err(Sense::INVALID_FIELD_IN_CDB));
        assert_eq!(decode(&cdb(&[0x5e, 3, 0, 0, 0, 0, 0, 1, 0])), Ok(Command::In { service_action: 3, allocation: 256 }));
        assert_eq!(decode(&cdb(&[0x5f, 7, 0, 0, 0, 0, 0, 0, 24])), Err(Sense::INVALID_FIELD_IN_CDB), "REGISTER AND MOVE");
        assert_eq!(decode(&cdb(&[0x5f, 1, 2])), Err(Sense::INVALID_FIELD_IN_CDB), "type 2");
        assert_eq!(decode(&cdb(&[0x5f, 1, 0x11])), Err(Sense::INVALID_FIELD_IN_CDB), "scope 1");
        assert_eq!(decode(&cdb(&[0x5f, 1, 3, 0, 0, 0, 0, 0, 24])), Ok(Command::Out { service_action: 1, kind: 3, parameter_bytes: 24 }));
        assert_eq!(decode(&cdb(&[0x16, 1])), Err(Sense::INVALID_FIELD_IN_CDB));
    }

    #[test]
    fn registrations_are_bounded() {
        let mut u = UnitState::default();
        for i in 0..REGISTRATIONS_MAX {
            out(&mut u, &format!("iqn.{i},i,0x0"), 6, 0, 0, 1).unwrap();
        }
        assert_eq!(out(&mut u, A, 6, 0, 0, 1), Err(Refusal::Check(INSUFFICIENT_REGISTRATION_RESOURCES)));
    }

    #[test]
    fn unregistering_holder_releases_and_tells_registrants_of_ro_types() {
        for (kind, released, attention) in [(1u8, true, false), (5, true, true), (7, false, false)] {
            let mut u = unit();
            out(&mut u, A, 6, 0, 0, 0xa).unwrap();
            out(&mut u, B, 6, 0, 0, 0xb).unwrap();
            out(&mut u, A, 1, kind, 0xa, 0).unwrap();
            out(&mut u, A, 0, 0, 0xa, 0).unwrap();
            assert_eq!(u.pr.reservation().is_none(), released, "type {kind}");
            // never for the nexus that unregistered
            assert_eq!(u.check(A, &TUR), Verdict::Run);
            let expected = if attention { Verdict::Refuse(Refusal::Check(UA_RESERVATIONS_RELEASED)) } else { Verdict::Run };
            assert_eq!(u.check(B, &TUR), expected, "type {kind}");
        }
    }

    #[test]
    fn preempt_semantics() {
        // no reservation: the victim's registration goes, generation +1, UA to it
        let mut u = unit();
        out(&mut u, A, 6, 0, 0, 0xa).unwrap();
        out(&mut u, B, 6, 0, 0, 0xb).unwrap();
        let generation = u.pr.generation();
        assert_eq!(out(&mut u, B, 4, 3, 0xb, 0), Err(Refusal::Check(Sense::INVALID_FIELD_IN_PARAMETER_LIST)));
        assert_eq!(out(&mut u, B, 4, 3, 0xb, 0x77), Err(Refusal::Conflict), "no such key");
        out(&mut u, B, 4, 3, 0xb, 0xa).unwrap();
        assert_eq!(u.pr.generation(), generation + 1);
        assert_eq!(u.pr.key_of(A), None);
        assert_eq!(u.check(A, &INQUIRY), Verdict::Run, "INQUIRY does not report a unit attention");
        assert_eq!(u.check(A, &[0x03, 0, 0, 0, 18, 0]), Verdict::SenseData(UA_REGISTRATIONS_PREEMPTED));
        assert_eq!(u.check(A, &TUR), Verdict::Run, "reported once");
        assert!(u.pr.reservation().is_none());

        // preempting the holder: the reservation moves with the new type
        let mut u = unit();
        out(&mut u, A, 6, 0, 0, 0xa).unwrap();
        out(&mut u, B, 6, 0, 0, 0xb).unwrap();
        out(&mut u, C, 6, 0, 0, 0xc).unwrap();
        out(&mut u, A, 1, 1, 0xa, 0).unwrap();
        out(&mut u, B, 5, 3, 0xb, 0xa).unwrap();
        assert_eq!(u.pr.reservation(), Some(&Reservation { holder: B.to_string(), kind: PrType::ExclusiveAccess }));
        assert_eq!(u.check(A, &TUR), Verdict::Refuse(Refusal::Check(UA_REGISTRATIONS_PREEMPTED)));
        assert_eq!(u.check(C, &TUR), Verdict::Refuse(Refusal::Check(UA_RESERVATIONS_RELEASED)), "type changed");
        assert_eq!(u.check(B, &TUR), Verdict::Run);
        assert_eq!(u.check(A, &READ10), Verdict::Refuse(Refusal::Conflict));

        // all registrants with key 0: everyone else goes
        let mut u = unit();
        out(&mut u, A, 6, 0, 0, 0xa).unwrap();
        out(&mut u, B, 6, 0, 0, 0xb).unwrap();
        out(&mut u, A, 1, 7, 0xa, 0).unwrap();
        out(&mut u, B, 4, 1, 0xb, 0).unwrap();
        assert_eq!(u.pr.registered(), 1);
        assert_eq!(u.pr.reservation(), Some(&Reservation { holder: B.to_string(), kind: PrType::WriteExclusive }));

        // CLEAR: everything goes, the others learn it
        out(&mut u, A, 6, 0, 0, 0xa).unwrap();
        let generation = u.pr.generation();
        assert_eq!(out(&mut u, C, 3, 0, 0, 0), Err(Refusal::Conflict));
        out(&mut u, B, 3, 0, 0xb, 0).unwrap();
        assert!(u.pr.is_empty());
        assert_eq!(u.pr.generation(), generation + 1);
        assert_eq!(u.check(A, &TUR), Verdict::Refuse(Refusal::Check(UA_REGISTRATIONS_PREEMPTED)));
        assert_eq!(u.check(A, &TUR), Verdict::Refuse(Refusal::Check(UA_RESERVATIONS_PREEMPTED)));
        assert_eq!(u.check(C, &TUR), Verdict::Run, "C was not registered");
    }

    #[test]
    fn reserve6_conflicts_and_resets() {
        let mut u = unit();
        const RESERVE6: [u8; 6] = [0x16, 0, 0, 0, 0, 0];
        const RELEASE6: [u8; 6] = [0x17, 0, 0, 0, 0, 0];
        assert_eq!(u.check(A, &RESERVE6), Verdict::Run);
        u.reserve6(A).unwrap();
        u.reserve6(A).unwrap();
        assert_eq!(u.check(B, &RESERVE6), Verdict::Refuse(Refusal::Conflict));
        assert_eq!(u.check(B, &RELEASE6), Verdict::Run);
        u.release6(B);
        assert_eq!(u.check(B, &MODE_SENSE6), Verdict::Refuse(Refusal::Conflict));
        assert_eq!(u.check(A, &MODE_SENSE6), Verdict::Run);
        assert_eq!(u.check(B, &INQUIRY), Verdict::Run);
        assert_eq!(u.check(A, &[0x5e, 0, 0, 0, 0, 0, 0, 0, 8, 0]), Verdict::Refuse(Refusal::Conflict));
        // the holder's session ends: released
        u.detach(A);
        assert_eq!(u.check(B, &RESERVE6), Verdict::Run);
        u.reserve6(B).unwrap();
        // a LUN reset releases, and tells every session
        u.attach(A);
        u.reset(UA_LUN_RESET);
        for n in [A, B, C] {
            assert_eq!(u.check(n, &WRITE10), Verdict::Refuse(Refusal::Check(UA_LUN_RESET)));
            assert_eq!(u.check(n, &WRITE10), Verdict::Run);
        }
        // registrations make RESERVE(6) conflict
        out(&mut u, C, 6, 0, 0, 0xc).unwrap();
        assert_eq!(u.check(A, &RESERVE6), Verdict::Refuse(Refusal::Conflict));
    }

    #[test]
    fn a_quiet_unit_answers_without_the_lock_and_wakes_on_any_change() {
        let units = Units::default();
        let a = units.attach("tank/vol", "1@4", A, || None);
        let b = units.attach("tank/vol", "1@4", B, || None);
        assert!(Arc::ptr_eq(&a, &b), "one state per volume");
        assert!(a.quiet.load(Ordering::Acquire));
        a.update(|s| s.raise_for_others(A, UA_MODE_PARAMETERS_CHANGED));
        assert!(!a.quiet.load(Ordering::Acquire));
        assert_eq!(b.check(B, &WRITE10), Verdict::Refuse(Refusal::Check(UA_MODE_PARAMETERS_CHANGED)));
        assert!(a.quiet.load(Ordering::Acquire), "quiet again once reported");
        a.update(|s| s.reserve6(A)).unwrap();
        assert_eq!(b.check(B, &WRITE10), Verdict::Refuse(Refusal::Conflict));
        units.detach("tank/vol", A, &a);
        assert_eq!(b.check(B, &WRITE10), Verdict::Run, "the holder's session ended");
        units.detach("tank/vol", B, &b);
        assert!(units.map.lock().is_empty(), "an idle unit is dropped");
        // a stored state is loaded on first use
        let stored = {
            let mut u = UnitState::default();
            u.persistent_reserve_out(A, 6, 0, 24, &params(0, 0xa, true)).unwrap().unwrap()
        };
        let c = units.attach("tank/other", "2@9", C, || Some(stored.clone()));
        assert_eq!(c.update(|s| s.pr.key_of(A)), Some(0xa));
        assert!(!c.quiet.load(Ordering::Acquire));
        // the volume destroyed and created again under its name: not its state
        let d = units.attach("tank/other", "3@20", B, || None);
        assert!(!Arc::ptr_eq(&c, &d), "a new volume under an old name gets a fresh state");
        assert_eq!(d.update(|s| s.pr.key_of(A)), None);
    }

    #[test]
    fn attentions_are_bounded_and_only_for_attached_nexuses() {
        let mut u = unit();
        u.raise("iqn.gone,i,0x0", UA_LUN_RESET);
        assert!(!u.attached.contains_key("iqn.gone,i,0x0"));
        for sense in [UA_LUN_RESET, UA_TARGET_RESET, UA_MODE_PARAMETERS_CHANGED, UA_RESERVATIONS_PREEMPTED, UA_RESERVATIONS_RELEASED, UA_REGISTRATIONS_PREEMPTED, INVALID_RELEASE, INSUFFICIENT_REGISTRATION_RESOURCES, Sense::MISCOMPARE] {
            u.raise(A, sense);
        }
        assert_eq!(u.attached[A].attentions.len(), ATTENTIONS_MAX);
    }

    #[test]
    fn persistence_round_trip_and_aptpl() {
        let mut u = unit();
        let weird = "iqn.2026-01.x:y z%,i,0x00023d000001";
        assert!(u.persistent_reserve_out(weird, 6, 0, 24, &params(0, 0x1234, true)).unwrap().is_some());
        out(&mut u, B, 6, 0, 0, 0xb).map(|_| ()).unwrap_or(());
        // the last REGISTER had APTPL off: the stored state goes
        assert_eq!(out(&mut u, A, 6, 0, 0, 0xa), Ok(None));
        let stored = u.persistent_reserve_out(A, 6, 0, 24, &params(0, 0xaa, true)).unwrap().unwrap();
        let stored = u.persistent_reserve_out(A, 1, 1, 24, &params(0xaa, 0, false)).unwrap().unwrap_or(stored);
        let loaded = PrState::decode(&stored).unwrap();
        assert_eq!(loaded, u.pr);
        assert_eq!(loaded.reservation().unwrap().holder, A);
        assert_eq!(loaded.key_of(weird), Some(0x1234));
        assert!(loaded.aptpl());
        // turning APTPL off stores the empty state
        assert_eq!(u.persistent_reserve_out(A, 6, 0, 24, &params(0, 0xab, false)), Ok(Some(String::new())));
        for bad in ["", "zpr2 0 0 -", "zpr1 1 1 -", "zpr1 1 0 - 0000000000000000=a", "zpr1 1 1 3 000000000000000a=a", "zpr1 x 0 -", "zpr1 1 0 - 1=a"] {
            assert_eq!(PrState::decode(bad), None, "{bad}");
        }
        assert_eq!(PrState::decode("zpr1 7 0 -").unwrap().generation(), 7);
    }
}
