//! Behaviour Redis defines, checked side by side against a real `redis-server` started by the
//! test: the same requests go to both, and the replies must be identical.

mod common;

use common::real_redis::{RealRedis, SideBySide};
use common::{TestNode, bounded};

#[tokio::test]
async fn plain_string_commands_answer_as_redis_does() {
    bounded(async {
        let node = TestNode::start().await;
        let redis = RealRedis::start().await;
        let mut sb = SideBySide::connect(&node, &redis).await;
        sb.same(&["GET", "compat:missing"]).await;
        sb.same(&["SET", "compat:a", "1"]).await;
        sb.same(&["INCRBY", "compat:a", "41"]).await;
        sb.same(&["GET", "compat:a"]).await;
        sb.same_error(&["INCRBY", "compat:a", "x"]).await;
        sb.same_error(&["GET"]).await;
        node.shutdown().await;
    })
    .await;
}
