import Testing

@testable import BackstopTransport

private let input = SocketInterest.input
private let output = SocketInterest.output
private let both = SocketInterest.input | SocketInterest.output
private let remove = SocketInterest.remove

/// Feeds curl's socket-callback requests for `fd` in order and returns the epoll calls they cost.
private func actions(_ interest: inout SocketInterest, _ fd: Int32, _ requests: [Int32]) -> [SocketInterest.Action] {
    requests.map { interest.curlWants(fd, $0) }
}

@Suite("Socket interest")
struct SocketInterestTests {
    /// A socket's events go to the multi handle whose callback asked for it, and a number reused after a close
    /// belongs to no group until its new owner asks.
    @Test func eachSocketRemembersWhichMultiHandleAskedForIt() {
        var interest = SocketInterest()
        interest.opened(5)
        #expect(interest.group(of: 5) == -1)
        #expect(interest.curlWants(5, output, group: 2) == .add(output))
        #expect(interest.group(of: 5) == 2)
        #expect(interest.curlWants(6, input) == .add(input))
        #expect(interest.group(of: 6) == -1, "the transport's own multi handle")
        #expect(interest.curlWants(5, remove, group: 2) == .modify(input))
        #expect(interest.group(of: 5) == 2)
        interest.closed(5)
        #expect(interest.group(of: 5) == -1)
        interest.opened(5)
        #expect(interest.curlWants(5, input) == .add(input))
        #expect(interest.group(of: 5) == -1)
        #expect(interest.group(of: 99) == -1, "a socket nobody asked for")
    }

    @Test func ownedKeepAliveSocketIsRegisteredOnceForManyRequests() {
        var interest = SocketInterest()
        interest.opened(7)
        // First request: connect (output), then wait for the response (input), then the response ends.
        #expect(actions(&interest, 7, [output, input, remove]) == [.add(output), .modify(input), .none])
        // Every later request on the same connection: no epoll call at all.
        for _ in 0..<3 {
            #expect(actions(&interest, 7, [input, remove]) == [.none, .none])
        }
        // A request body that does not fit the socket buffer asks for output again, and parks back on input.
        #expect(actions(&interest, 7, [both, input, remove]) == [.modify(both), .modify(input), .none])
    }

    @Test func socketParkedForOutputIsSwitchedToInputOnly() {
        var interest = SocketInterest()
        interest.opened(3)
        #expect(actions(&interest, 3, [output, remove]) == [.add(output), .modify(input)])
        #expect(interest.eventArrived(3) == false)
    }

    @Test func eventOnParkedSocketUnregistersIt() {
        var interest = SocketInterest()
        interest.opened(9)
        #expect(actions(&interest, 9, [input]) == [.add(input)])
        #expect(interest.eventArrived(9) == true)
        #expect(actions(&interest, 9, [remove]) == [.none])
        // The upstream closed the idle connection: the caller deletes it, and the next use registers it anew.
        #expect(interest.eventArrived(9) == false)
        #expect(actions(&interest, 9, [input]) == [.add(input)])
        #expect(interest.eventArrived(9) == true)
    }

    @Test func closedSocketsNumberReusedStartsUnregistered() {
        var interest = SocketInterest()
        interest.opened(5)
        #expect(actions(&interest, 5, [input, remove]) == [.add(input), .none])
        // curl closes it through the callback (epoll drops it) and a new connection gets the same number.
        interest.closed(5)
        interest.opened(5)
        #expect(actions(&interest, 5, [input]) == [.add(input)])
        // Even without a reported open (a socket curl made some other way), a closed number is not "registered".
        interest.closed(5)
        #expect(actions(&interest, 5, [input]) == [.add(input)])
    }

    @Test func socketNotOpenedByTheTransportIsDeletedAtOnce() {
        var interest = SocketInterest()
        // The resolver's socketpair: curl may close it without telling, so it is never parked.
        #expect(
            actions(&interest, 11, [input, remove, input, remove]) == [.add(input), .delete, .add(input), .delete])
        #expect(interest.eventArrived(11) == false)
    }

    @Test func removeOfUnknownSocketCostsNothing() {
        var interest = SocketInterest()
        #expect(actions(&interest, 40, [remove, remove]) == [.none, .none])
        interest.opened(41)
        #expect(actions(&interest, 41, [remove]) == [.none])
        #expect(actions(&interest, -1, [input, remove]) == [.add(input), .none])
    }

    @Test func failedRegistrationIsRetriedOnTheNextRequest() {
        var interest = SocketInterest()
        interest.opened(6)
        #expect(actions(&interest, 6, [input]) == [.add(input)])
        interest.registrationFailed(6)
        // curl still wants it, so an event would be passed on; the next request registers it again.
        #expect(interest.eventArrived(6) == true)
        #expect(actions(&interest, 6, [input]) == [.add(input)])
    }

    @Test func sameInterestTwiceIsOneCall() {
        var interest = SocketInterest()
        interest.opened(2)
        #expect(actions(&interest, 2, [both, both, input, input]) == [.add(both), .none, .modify(input), .none])
    }

    /// Every sequence of up to four requests on an owned socket, checked against a model of what epoll holds:
    /// the recorded registration always matches the calls made, curl's events are never lost while it wants
    /// them, and a parked socket is only ever registered for input.
    @Test func everyShortSequenceKeepsEpollInStepWithCurl() {
        let requests: [Int32] = [input, output, both, remove]
        var sequences: [[Int32]] = [[]]
        for _ in 0..<4 { sequences = sequences.flatMap { s in requests.map { s + [$0] } } }
        for owned in [true, false] {
            for sequence in sequences {
                var interest = SocketInterest()
                if owned { interest.opened(4) }
                var epoll: Int32 = 0  // what the kernel watches, per the calls made
                var wanted: Int32 = 0
                for what in sequence {
                    switch interest.curlWants(4, what) {
                    case .none: break
                    case .add(let events):
                        #expect(epoll == 0, "\(sequence): ADD of a registered socket")
                        epoll = events
                    case .modify(let events):
                        #expect(epoll != 0, "\(sequence): MOD of an unregistered socket")
                        epoll = events
                    case .delete:
                        #expect(epoll != 0, "\(sequence): DEL of an unregistered socket")
                        epoll = 0
                    }
                    wanted = what == remove ? 0 : what
                    if wanted != 0 { #expect(epoll == wanted, "\(sequence): watches \(epoll), curl wants \(wanted)") }
                    if wanted == 0 {
                        #expect(epoll == 0 || (owned && epoll == input), "\(sequence): parked as \(epoll)")
                    }
                }
            }
        }
    }
}

@Suite("Socket interest of raw connections")
struct RelaySocketInterestTests {
    @Test func aConnectionTakesOverAParkedSocketAndLetsGoOfIt() {
        var interest = SocketInterest()
        interest.opened(9)
        // curl connects (output), then the connect-only transfer ends: parked for input.
        #expect(actions(&interest, 9, [output, remove]) == [.add(output), .modify(input)])
        // The connection wants input (already registered), then both, then nothing.
        #expect(interest.relayWants(9, input) == .none)
        #expect(interest.relayWants(9, both) == .modify(both))
        #expect(interest.relayWants(9, 0) == .delete)
        #expect(interest.relayWants(9, 0) == .none)
        #expect(interest.relayWants(9, input) == .add(input))
    }

    @Test func closingResetsWhatTheConnectionWatched() {
        var interest = SocketInterest()
        interest.opened(4)
        #expect(interest.relayWants(4, both) == .add(both))
        interest.closed(4)
        interest.opened(4)
        #expect(actions(&interest, 4, [output]) == [.add(output)])
    }
}
