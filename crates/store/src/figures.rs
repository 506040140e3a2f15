//! The store's figures as one [`Registry`]: what `granary stat` prints
//! (text and JSON), what `/metrics` exports under `granary_store_*`,
//! `granary_device_*`, `granary_gc_*`, `granary_index_*` and
//! `granary_recovery_*`, and what memcache `stats` adds, all from this one
//! list. Each figure is declared here once, with its help.

use crate::Stats;
use granary_rt::metrics::{Kind, Registry, Value};

impl Stats {
    /// Every figure of the store, in the order `granary stat` prints them.
    pub fn registry(&self) -> Registry {
        let mut r = Registry::new();
        let st = self;
        r.info("device", "The device and how it is accessed.", st.device.clone())
            .info("device_bytes", "Size of the device.", st.device_bytes)
            .info("grain_bytes", "Allocation unit.", st.grain_bytes as u64)
            .info("segment_bytes", "Size of a segment.", st.segment_bytes)
            .info("segments", "Segments of the device.", st.segments);
        let segs = [
            ("segments_free", "free", st.segments_free),
            ("segments_open", "open", st.segments_open),
            ("segments_closed", "closed", st.segments_closed),
            ("segments_index", "index", st.segments_index),
        ];
        for (name, state, v) in segs {
            r.export(
                name,
                "Segments by state.",
                Kind::Gauge,
                "granary_store_segments",
                Some(("state", state)),
                v.into(),
            );
        }
        r.gauge("keys", "granary_store_keys", "Keys with a value.", st.keys)
            .gauge(
                "tombstones",
                "granary_store_tombstones",
                "Deleted keys whose tombstone is still current.",
                st.tombstones,
            )
            .gauge("live_bytes", "granary_store_live_bytes", "Bytes of the records the index points at.", st.live_bytes)
            .info("value_bytes_max", "Largest value the store holds (with a short key).", st.value_bytes_max)
            .gauge(
                "read_only",
                "granary_store_read_only",
                "1 once a device write or flush failed: writes are refused until the store is reopened.",
                u64::from(st.read_only.is_some()),
            );
        let ops = [
            ("gets", "get", st.gets),
            ("get_hits", "get_hit", st.get_hits),
            ("puts", "put", st.puts),
            ("deletes", "delete", st.deletes),
        ];
        for (name, op, v) in ops {
            r.export(
                name,
                "Engine operations.",
                Kind::Counter,
                "granary_store_operations_total",
                Some(("op", op)),
                v.into(),
            );
        }
        let io = &st.io;
        for (name, op, v) in
            [("io.reads", "read", io.reads), ("io.writes", "write", io.writes), ("io.flushes", "flush", io.flushes)]
        {
            r.export(
                name,
                "Device operations.",
                Kind::Counter,
                "granary_device_operations_total",
                Some(("op", op)),
                v.into(),
            );
        }
        for (name, dir, v) in
            [("io.read_bytes", "read", io.read_bytes), ("io.written_bytes", "written", io.written_bytes)]
        {
            r.export(
                name,
                "Device bytes read and written.",
                Kind::Counter,
                "granary_device_bytes_total",
                Some(("dir", dir)),
                v.into(),
            );
        }
        r.counter(
            "user_bytes_written",
            "granary_user_bytes_written_total",
            "Key and value bytes of PUTs and DELETEs.",
            st.user_bytes_written,
        )
        .gauge(
            "write_amplification",
            "granary_write_amplification",
            "Device bytes written per user byte written.",
            st.write_amplification(),
        )
        .counter("write_groups", "granary_write_groups_total", "Coalesced group writes.", st.write_groups)
        .counter(
            "grouped_records",
            "granary_grouped_records_total",
            "Records carried by group writes.",
            st.grouped_records,
        )
        .counter(
            "combined_puts",
            "granary_combined_puts_total",
            "PUTs of a hot key written by another PUT of the key that combined them into its record.",
            st.combined_puts,
        )
        .counter(
            "combined_updates",
            "granary_combined_updates_total",
            "Read-modify-writes of a hot key answered by another of the key that took their change into its own write.",
            st.combined_updates,
        )
        .counter(
            "blind_overwrites",
            "granary_blind_overwrites_total",
            "Overwrites that did not read the old record.",
            st.blind_overwrites,
        )
        .gauge(
            "unsettled_links",
            "granary_unsettled_links",
            "Index entries displaced by blind overwrites, not settled yet.",
            st.unsettled_links,
        )
        .gauge(
            "link_bytes",
            "granary_link_bytes",
            "DRAM held by unsettled blind-overwrite links.",
            st.link_bytes,
        );
        let d = &st.dram;
        r.gauge(
            "dram.limit_bytes",
            "granary_dram_limit_bytes",
            "Bound of the DRAM tier of hot values (0: off).",
            d.limit_bytes,
        )
        .gauge("dram.bytes", "granary_dram_bytes", "DRAM the tier's items hold (keys, values, overhead).", d.bytes)
        .gauge("dram.items", "granary_dram_items", "Items in the DRAM tier.", d.items)
        .counter("dram.hits", "granary_dram_hits_total", "GETs served from the DRAM tier.", d.hits)
        .counter("dram.misses", "granary_dram_misses_total", "GETs the DRAM tier could not serve.", d.misses)
        .counter("dram.admissions", "granary_dram_admissions_total", "Values the DRAM tier took in.", d.admissions)
        .counter("dram.evictions", "granary_dram_evictions_total", "Items the DRAM tier evicted.", d.evictions);
        // Apart from GC's figures: a dotted prefix's figures stay together,
        // as `granary stat --json` nests them.
        r.counter(
            "summaries_written",
            "granary_segment_summaries_written_total",
            "Segment summaries (the keys of a full segment's records) written since open.",
            st.summaries_written,
        )
        .counter(
            "summary_bytes_written",
            "granary_segment_summary_bytes_written_total",
            "Bytes of segment summaries written since open.",
            st.summary_bytes_written,
        );
        let gc = &st.gc;
        r.counter("gc.victims", "granary_gc_victims_total", "Segments reclaimed by GC.", gc.victims)
            .counter(
                "gc.sparse_victims",
                "granary_gc_sparse_victims_total",
                "Segments GC reclaimed reading only what the index or a link points at.",
                gc.sparse_victims,
            )
            .counter(
                "gc.summary_victims",
                "granary_gc_summary_victims_total",
                "Segments GC reclaimed by their summary: reading only what is live or may be.",
                gc.summary_victims,
            )
            .counter(
                "gc.compacted",
                "granary_gc_compacted_total",
                "Segments GC reclaimed ahead of need by compacting (gc_watermark compact).",
                gc.compacted,
            )
            .counter(
                "gc.records_relocated",
                "granary_gc_relocated_records_total",
                "Records GC moved.",
                gc.records_relocated,
            )
            .counter("gc.bytes_relocated", "granary_gc_relocated_bytes_total", "Bytes GC moved.", gc.bytes_relocated)
            .counter(
                "gc.tombstones_dropped",
                "granary_gc_tombstones_dropped_total",
                "Tombstones GC found dead and dropped.",
                gc.tombstones_dropped,
            )
            .counter("gc.expired", "granary_gc_expired_total", "Expired or flushed values GC dropped.", gc.expired)
            .counter(
                "gc.namespace_records_dropped",
                "granary_gc_namespace_records_dropped_total",
                "Records of dropped or truncated namespaces GC let go.",
                gc.namespace_records_dropped,
            )
            .counter(
                "gc.evicted_segments",
                "granary_evicted_segments_total",
                "Segments evicted whole (cache mode).",
                gc.evicted_segments,
            )
            .counter(
                "gc.evicted_values",
                "granary_evicted_values_total",
                "Values evicted (cache mode).",
                gc.evicted_values,
            )
            .counter(
                "gc.room_waits",
                "granary_gc_room_waits_total",
                "User writes that waited for GC to free room.",
                st.room_waits,
            )
            .counter(
                "gc.room_wait_us",
                "granary_gc_room_wait_microseconds_total",
                "Microseconds user writes waited for GC to free room, together.",
                st.room_wait_us,
            )
            .info("gc.low_watermark", "GC starts below this many free segments.", st.gc_watermarks.0 as u64)
            .info("gc.high_watermark", "GC stops at this many free segments.", st.gc_watermarks.1 as u64)
            .info("gc.policy", "GC's victim choice (gc_policy).", st.gc_settings.policy.name().to_string())
            .info(
                "gc.hot_cold",
                "1 if GC keeps hot and cold relocations apart (gc_hot_cold).",
                u64::from(st.gc_settings.hot_cold),
            )
            .info(
                "gc.sepbit",
                "1 if user writes and GC's relocations are placed by expected lifetime, SepBIT's way (gc_sepbit; off in zoned mode).",
                u64::from(st.gc_settings.sepbit),
            )
            .info(
                "gc.watermark",
                "How GC's low watermark is set (gc_watermark).",
                st.gc_settings.watermark.name().to_string(),
            )
            .info(
                "gc.discard",
                "1 if freed segments are discarded (discard, resolved for the device).",
                u64::from(st.gc_settings.discard),
            );
        let ix = &st.index;
        let occupancy = if ix.slots == 0 { 0.0 } else { ix.entries as f64 / ix.slots as f64 };
        r.gauge("index.entries", "granary_index_entries", "Index entries.", ix.entries)
            .info("index.tables", "Index tables.", ix.tables)
            .gauge("index.slots", "granary_index_slots", "Index slots.", ix.slots)
            .gauge("index.occupancy", "granary_index_occupancy", "Index entries per slot.", occupancy)
            .gauge(
                "index.memory_bytes",
                "granary_index_memory_bytes",
                "DRAM held by the index tables.",
                ix.memory_bytes,
            )
            .counter("index.grows", "granary_index_resizes_total", "Index directory doublings.", ix.grows);
        let rec = &st.recovery;
        r.info("recovery.segments_scanned", "Log segments the last open scanned.", rec.segments_scanned)
            .info("recovery.records", "Records the last open's log scan found.", rec.records)
            .info(
                "recovery.damaged_records",
                "Records whose checksum failed outside the newest segments (indexed: reading them reports corruption).",
                rec.damaged_records,
            )
            .info("recovery.torn_records", "Records torn by a crash (never acknowledged), ignored.", rec.torn_records)
            .info("recovery.skipped_grains", "Grains the log scan skipped (holes, leftovers).", rec.skipped_grains)
            .info("recovery.bytes_read", "Bytes the log scan read.", rec.bytes_read)
            .info("recovery.millis", "Duration of the last open, milliseconds.", rec.millis)
            .gauge(
                "recovery.seconds",
                "granary_recovery_seconds",
                "Duration of the last open's recovery.",
                rec.millis as f64 / 1000.0,
            )
            .info("recovery.scan_millis", "Duration of the log scan, milliseconds.", rec.scan_millis)
            .info("recovery.scan_mb_per_s", "Log scan rate, MB/s.", rec.scan_mb_per_s())
            .info("recovery.threads", "Threads of the log scan.", rec.threads)
            .info(
                "recovery.checkpoint_id",
                "Index checkpoint loaded (0: none; the whole log was scanned).",
                rec.checkpoint_id,
            )
            .info("recovery.checkpoint_session", "Session that wrote the checkpoint loaded.", rec.checkpoint_session)
            .info("recovery.checkpoint_entries", "Entries of the checkpoint loaded.", rec.checkpoint_entries)
            .info("recovery.checkpoint_dropped", "Stale checkpoint entries dropped.", rec.checkpoint_dropped)
            .info("recovery.checkpoint_millis", "Time to load the checkpoint, milliseconds.", rec.checkpoint_millis)
            .export(
                "recovery.clean_shutdown",
                "1 if the last open found a clean shutdown.",
                Kind::Gauge,
                "granary_recovery_clean",
                None,
                Value::Bool(rec.clean_shutdown),
            );
        let ck = &st.checkpoints;
        r.info("checkpoints.current_id", "The current index checkpoint.", ck.current_id)
            .counter(
                "checkpoints.written",
                "granary_checkpoints_written_total",
                "Index checkpoints written.",
                ck.written,
            )
            .counter(
                "checkpoints.failed",
                "granary_checkpoints_failed_total",
                "Index checkpoints that failed.",
                ck.failed,
            )
            .info("session", "Random id of this open session (written into its checkpoints).", st.session);
        r
    }
}

#[cfg(test)]
mod tests {
    /// Each dotted prefix's figures are next to each other: `granary stat
    /// --json` nests them, and a prefix met again would be a second object
    /// of its name, which JSON readers take for the first's replacement.
    #[test]
    fn a_prefix_s_figures_are_together() {
        assert!(crate::Stats::default().registry().prefixes_together());
    }
}
