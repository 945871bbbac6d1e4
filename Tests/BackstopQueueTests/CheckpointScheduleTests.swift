import Testing

@testable import BackstopQueue

/// When the store's WAL is copied into its database file, and by whom (docs/performance.md#queued-delivery): the
/// bulk in the background, the last frames by the writer once the WAL is long, so that it starts over.
@Suite("Checkpoint schedule")
struct CheckpointScheduleTests {
    @Test("a background copy starts once the frames not yet copied reach the threshold, one at a time")
    func background() {
        var schedule = CheckpointSchedule(threshold: 100, limit: 400)
        #expect(schedule.committed(walFrames: 40) == .none)
        #expect(schedule.committed(walFrames: 99) == .none)
        #expect(schedule.committed(walFrames: 100) == .background)
        #expect(schedule.running)
        #expect(schedule.committed(walFrames: 260) == .none, "one copy at a time")
        // It copied the 100 frames the WAL held when it started; 160 came meanwhile: another copy at once.
        #expect(schedule.backgroundEnded(walFrames: 100, copied: 100) == .background)
        #expect(schedule.walFrames == 260 && schedule.copied == 100, "an older report does not undo a newer one")
        #expect(schedule.backgroundEnded(walFrames: 290, copied: 290) == .none)
        #expect(schedule.walFrames == 290 && schedule.copied == 290 && !schedule.running)
        #expect(schedule.committed(walFrames: 389) == .none)
        #expect(schedule.committed(walFrames: 390) == .background)
    }

    @Test("a long WAL: the writer copies the few frames left itself, and the WAL starting over is seen")
    func foreground() {
        var schedule = CheckpointSchedule(threshold: 100, limit: 400)
        #expect(schedule.committed(walFrames: 350) == .background)
        #expect(schedule.committed(walFrames: 420) == .none, "not while a background copy runs")
        #expect(schedule.backgroundEnded(walFrames: 350, copied: 350) == .none, "the writer's copy is the writer's")
        #expect(schedule.committed(walFrames: 430) == .foreground)
        #expect(!schedule.running)
        schedule.foregroundEnded(walFrames: 430, copied: 430)
        #expect(schedule.committed(walFrames: 12) == .none, "the WAL started over")
        #expect(schedule.walFrames == 12 && schedule.copied == 0)
        #expect(schedule.committed(walFrames: 112) == .background)
    }

    @Test("a copy that could not run is tried again after the next commit; a failed writer's copy too")
    func failures() {
        var schedule = CheckpointSchedule(threshold: 100, limit: 400)
        #expect(schedule.committed(walFrames: 100) == .background)
        #expect(schedule.backgroundEnded(walFrames: nil, copied: nil) == .none, "not again at once")
        #expect(schedule.committed(walFrames: 104) == .background, "the next commit starts it again")
        #expect(schedule.backgroundEnded(walFrames: 104, copied: 104) == .none)
        #expect(schedule.committed(walFrames: 410) == .background)
        #expect(schedule.backgroundEnded(walFrames: 410, copied: 380) == .none, "a reader held 30 frames back")
        #expect(schedule.committed(walFrames: 420) == .foreground)
        schedule.foregroundEnded(walFrames: nil, copied: nil)
        #expect(schedule.committed(walFrames: 425) == .foreground)
        schedule.foregroundEnded(walFrames: 425, copied: 425)
        #expect(schedule.committed(walFrames: 430) == .foreground, "the WAL did not start over (a reader on it)")
    }

    @Test("after close no copy starts; close says whether one still runs")
    func close() {
        var idle = CheckpointSchedule(threshold: 100, limit: 400)
        let idleClosed = idle.close()
        #expect(idleClosed)
        #expect(idle.committed(walFrames: 500) == .none)

        var busy = CheckpointSchedule(threshold: 100, limit: 400)
        #expect(busy.committed(walFrames: 100) == .background)
        let busyClosed = busy.close()
        #expect(busyClosed == false)
        #expect(busy.backgroundEnded(walFrames: 100, copied: 50) == .none)
        #expect(busy.committed(walFrames: 500) == .none)
    }

    @Test("the limit is never below the threshold")
    func limitAtLeastThreshold() {
        var schedule = CheckpointSchedule(threshold: 100, limit: 10)
        #expect(schedule.limit == 100)
        #expect(schedule.committed(walFrames: 50) == .none)
    }
}
